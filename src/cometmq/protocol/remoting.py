"""RemotingCommand and its frame codec (sans-I/O): bytes in, commands out, bytes back.

Frame: ``length`` (4, big-endian, excludes itself) | header word (4: serialize type << 24 | header length) |
header | body. The header is JSON (all the C++ client sends and understands) or RocketMQ's binary layout.
Everything a peer can get wrong raises ``RemoteProtocolError``; nothing else escapes the decoder. A command we
cannot encode (a field out of range for the wire) raises ``LocalProtocolError``: that is our bug, not the peer's.
"""

from __future__ import annotations

import itertools
import json
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from enum import IntEnum
from typing import Any

from cometmq.common.native import load_c_helper
from cometmq.protocol.codes import LanguageCode, ResponseCode
from cometmq.protocol.errors import LocalProtocolError, ProtocolError, RemoteProtocolError

RESPONSE_FLAG = 0x1
ONEWAY_FLAG = 0x2
# MQVersion ordinal of 4.9.4, the broker generation we present ourselves as; peers only log it.
DEFAULT_VERSION = 401
DEFAULT_MAX_FRAME_SIZE = 16 * 1024 * 1024  # RocketMQ's default frame limit
MAX_HEADER_LENGTH = 0xFFFFFF  # the header word keeps 24 bits for it

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_INT16_MIN, _INT16_MAX = -(2**15), 2**15 - 1

_U32 = struct.Struct(">I")
_PREFIX = struct.Struct(">II")
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_BIN_FIXED = struct.Struct(">hBhii")  # code, language, version, opaque, flag

_LANGUAGE_NAMES = {lc.value: lc.name for lc in LanguageCode}
_LANGUAGE_BYTES = {lc.name: lc.value for lc in LanguageCode}

# ensure_ascii: the header stays pure ASCII, so a lone surrogate a peer smuggled into a string can be echoed
# back without an encode error, and every JSON reader (jsoncpp, fastjson) handles the \u escapes.
_json_encode = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), check_circular=False).encode
_json_decode = json.JSONDecoder().decode

# The header codec in C (cometmq.protocol._sendv2c: loads_header, dumps_header), when built: it reads and writes
# the usual header the way the json module does (tests/protocol/test_header_codec.py compares them), as fast as
# orjson did (a PULL_MESSAGE header in a hot loop: encode ~1.0 us, decode ~3.1 us; the json module took ~17 us to
# encode one after a pause), and a broker does not load orjson for it (0.5 MiB with what orjson imports). A header
# it does not take (a float, an array, a lone surrogate, a value that is not a str) goes through the json module,
# which decides as it always did.
_HEADER_C: Any = load_c_helper("cometmq.protocol._sendv2c")


class SerializeType(IntEnum):
    JSON = 0
    ROCKETMQ = 1


_JSON, _ROCKETMQ = SerializeType.JSON, SerializeType.ROCKETMQ


@dataclass(frozen=True, slots=True)
class RemotingCommand:
    """One request or response. ``ext_fields`` values are always strings (the wire form of every header)."""

    code: int
    language: str = "PYTHON"
    version: int = DEFAULT_VERSION
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    ext_fields: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    serialize_type: SerializeType = SerializeType.JSON

    @property
    def is_response(self) -> bool:
        return bool(self.flag & RESPONSE_FLAG)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & ONEWAY_FLAG)


_SLOTS = tuple(RemotingCommand.__dict__[f.name].__set__ for f in fields(RemotingCommand))
if [f.name for f in fields(RemotingCommand)] != ["code", "language", "version", "opaque", "flag", "remark",
                                                 "ext_fields", "body", "serialize_type"]:
    raise RuntimeError("RemotingCommand's fields changed: update _command")
_set_code, _set_language, _set_version, _set_opaque, _set_flag, _set_remark, _set_ext, _set_body, _set_stype = _SLOTS
_new = object.__new__


def _command(code: int, language: str, version: int, opaque: int, flag: int, remark: str | None,
             ext_fields: dict[str, str], body: bytes, serialize_type: SerializeType) -> RemotingCommand:
    """``RemotingCommand(...)`` with every field given, at half the cost: a frozen dataclass's ``__init__`` goes
    through ``object.__setattr__`` per field, this sets the slots directly (the codec builds one per frame)."""
    cmd = _new(RemotingCommand)
    _set_code(cmd, code)
    _set_language(cmd, language)
    _set_version(cmd, version)
    _set_opaque(cmd, opaque)
    _set_flag(cmd, flag)
    _set_remark(cmd, remark)
    _set_ext(cmd, ext_fields)
    _set_body(cmd, body)
    _set_stype(cmd, serialize_type)
    return cmd


_opaque_counter = itertools.count(1)


def next_opaque() -> int:
    """A fresh request id; ids only need to be unique among one connection's requests in flight."""
    return next(_opaque_counter) & 0x7FFFFFFF


def _ext_value(key: str, value: object, error: type[ProtocolError]) -> str | None:
    if type(value) is str:
        return value
    if value is None:  # RocketMQ leaves null header fields out
        return None
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int | float):
        return str(value)
    raise error(f"extFields[{key!r}] is a {type(value).__name__}, not a scalar")


def normalize_ext_fields(
    fields: Mapping[str, object], error: type[ProtocolError] = LocalProtocolError
) -> dict[str, str]:
    """Return ``fields`` with every value as a string: the C++ client mixes JSON numbers, strings and
    booleans, while replies must carry strings. ``None`` values are dropped; lists and objects raise ``error``:
    a ``LocalProtocolError`` for fields we are building, a ``RemoteProtocolError`` for fields a peer sent."""
    out: dict[str, str] = {}
    for key, value in fields.items():
        if type(key) is not str:
            raise error(f"extFields key {key!r} is not a string")
        text = _ext_value(key, value, error)
        if text is not None:
            out[key] = text
    return out


def _str_fields(fields: Mapping[str, object] | None) -> dict[str, str]:
    if not fields:
        return {}
    for value in fields.values():
        if type(value) is not str:
            return normalize_ext_fields(fields)
    return dict(fields)  # type: ignore[arg-type]  # every value was just checked to be a str


def _wire_fields(fields: dict[str, str]) -> dict[str, str]:
    """``fields`` itself when it already is all strings (the usual case: no copy on the encode path)."""
    for value in fields.values():
        if type(value) is not str:
            return normalize_ext_fields(fields)
    return fields


def make_request(
    code: int,
    ext_fields: Mapping[str, object] | None = None,
    body: bytes = b"",
    *,
    remark: str | None = None,
    oneway: bool = False,
    opaque: int | None = None,
    serialize_type: SerializeType = SerializeType.JSON,
) -> RemotingCommand:
    """A request with a fresh opaque; ``ext_fields`` values may be ints/bools and are turned into strings."""
    return RemotingCommand(
        code=int(code),
        opaque=next_opaque() if opaque is None else opaque,
        flag=ONEWAY_FLAG if oneway else 0,
        remark=remark,
        ext_fields=_str_fields(ext_fields),
        body=body,
        serialize_type=serialize_type,
    )


def make_response(
    request: RemotingCommand,
    code: int = ResponseCode.SUCCESS,
    remark: str | None = None,
    ext_fields: Mapping[str, object] | None = None,
    body: bytes = b"",
) -> RemotingCommand:
    """The reply to ``request``: same opaque and serialize type (C++ only reads JSON), response flag set."""
    return _command(int(code), "PYTHON", DEFAULT_VERSION, request.opaque, RESPONSE_FLAG, remark,
                    _str_fields(ext_fields), body, request.serialize_type)


# -- encoding ----------------------------------------------------------------------------------------------


def _json_header(cmd: RemotingCommand) -> bytes:
    ext = _wire_fields(cmd.ext_fields)  # always present: C++ dereferences it (gotcha 1)
    if _HEADER_C is not None:
        raw: bytes | None = _HEADER_C.dumps_header(cmd.code, cmd.language, cmd.version, cmd.opaque, cmd.flag,
                                                   cmd.remark, ext)
        if raw is not None:
            return raw
    header: dict[str, object] = {
        "code": cmd.code,
        "language": cmd.language,
        "version": cmd.version,
        "opaque": cmd.opaque,
        "flag": cmd.flag,
    }
    if cmd.remark is not None:
        header["remark"] = cmd.remark
    header["extFields"] = ext
    header["serializeTypeCurrentRPC"] = "JSON"
    return _json_encode(header).encode("ascii")


def _utf8(text: str) -> bytes:
    # Java writes '?' for unpaired surrogates; do the same rather than fail on a string a peer sent us.
    return text.encode("utf-8", "replace")


def _binary_header(cmd: RemotingCommand) -> bytes:
    if not _INT16_MIN <= cmd.code <= _INT16_MAX:
        raise LocalProtocolError(f"code {cmd.code} does not fit the binary header's int16; send it as JSON")
    if not _INT16_MIN <= cmd.version <= _INT16_MAX:
        raise LocalProtocolError(f"version {cmd.version} does not fit the binary header's int16")
    language = _LANGUAGE_BYTES.get(cmd.language, LanguageCode.OTHER)
    parts = [_BIN_FIXED.pack(cmd.code, language, cmd.version, cmd.opaque, cmd.flag)]
    if cmd.remark:
        remark = _utf8(cmd.remark)
        parts += (_I32.pack(len(remark)), remark)
    else:
        parts.append(_I32.pack(0))  # RocketMQ writes null and "" alike as length 0
    fields: list[bytes] = []
    for key, value in _wire_fields(cmd.ext_fields).items():
        kb, vb = _utf8(key), _utf8(value)
        if len(kb) > _INT16_MAX:
            raise LocalProtocolError(f"extFields key of {len(kb)} bytes is too long for the binary header")
        fields += (_I16.pack(len(kb)), kb, _I32.pack(len(vb)), vb)
    packed = b"".join(fields)
    parts += (_I32.pack(len(packed)), packed)
    return b"".join(parts)


def encode_parts(cmd: RemotingCommand) -> tuple[bytes, bytes]:
    """``(length + header word + header, body)``: lets a transport send a large body without joining."""
    stype = cmd.serialize_type
    if stype == 0:  # SerializeType.JSON
        header = _json_header(cmd)
    elif stype == 1:  # SerializeType.ROCKETMQ
        header = _binary_header(cmd)
    else:
        raise LocalProtocolError(f"unknown serialize type {cmd.serialize_type!r}")
    if len(header) > MAX_HEADER_LENGTH:
        raise LocalProtocolError(f"header of {len(header)} bytes exceeds the 24-bit header length")
    length = 4 + len(header) + len(cmd.body)
    if length > _INT32_MAX:
        raise LocalProtocolError(f"frame of {length} bytes exceeds the 31-bit frame length")
    return _PREFIX.pack(length, (int(stype) << 24) | len(header)) + header, cmd.body


def encode(cmd: RemotingCommand) -> bytes:
    """The whole frame, length prefix included."""
    head, body = encode_parts(cmd)
    return head + body if body else head


# -- decoding ----------------------------------------------------------------------------------------------


def _int_field(header: dict[str, object], key: str, default: int | None) -> int:
    value = header.get(key, default)
    if type(value) is not int:  # bool is an int subclass; the C++ client drops frames with string codes too
        raise RemoteProtocolError(f"header field {key!r} must be an integer, got {value!r:.40}")
    if not _INT32_MIN <= value <= _INT32_MAX:
        raise RemoteProtocolError(f"header field {key!r} = {value} is outside int32")
    return value


def _decode_json_header(
    raw: memoryview,
) -> tuple[int, str, int, int, int, str | None, dict[str, str]]:
    if _HEADER_C is not None:
        parsed = _HEADER_C.loads_header(raw)
        if parsed is not None:  # what json.loads would have read
            return _header_fields(parsed)
    try:
        header = _json_decode(str(raw, "utf-8"))
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise RemoteProtocolError(f"header is not valid JSON: {exc}") from None
    return _header_fields(header)


def _header_fields(
    header: object,
) -> tuple[int, str, int, int, int, str | None, dict[str, str]]:
    if type(header) is not dict:
        raise RemoteProtocolError("JSON header is not an object")
    get = header.get
    code, opaque, flag, version = get("code"), get("opaque", 0), get("flag", 0), get("version", 0)
    # the usual header in one test; anything else field by field, for the error that names the field
    if not (type(code) is int and type(opaque) is int and type(flag) is int and type(version) is int
            and _INT32_MIN <= code <= _INT32_MAX and _INT32_MIN <= opaque <= _INT32_MAX
            and _INT32_MIN <= flag <= _INT32_MAX and _INT32_MIN <= version <= _INT32_MAX):
        code = _int_field(header, "code", None)
        opaque = _int_field(header, "opaque", 0)
        flag = _int_field(header, "flag", 0)
        version = _int_field(header, "version", 0)
    language = get("language", "JAVA")
    if type(language) is not str:
        if type(language) is not int:
            raise RemoteProtocolError(f"header field 'language' must be a string, got {language!r:.40}")
        language = _LANGUAGE_NAMES.get(language, "OTHER")
    remark = get("remark")
    if remark is not None and type(remark) is not str:
        raise RemoteProtocolError(f"header field 'remark' must be a string, got {remark!r:.40}")
    ext = get("extFields")
    if ext is None:
        ext = {}
    elif type(ext) is not dict:
        raise RemoteProtocolError("header field 'extFields' is not an object")
    else:
        for value in ext.values():
            if type(value) is not str:
                ext = normalize_ext_fields(ext, RemoteProtocolError)
                break
    return code, language, version, opaque, flag, remark, ext


def _decode_binary_header(
    view: memoryview,
) -> tuple[int, str, int, int, int, str | None, dict[str, str]]:
    raw = bytes(view)  # one copy; slicing bytes is cheaper than slicing a memoryview per field
    end = len(raw)
    try:
        code, lang, version, opaque, flag = _BIN_FIXED.unpack_from(raw, 0)
        pos = _BIN_FIXED.size
        (rlen,) = _I32.unpack_from(raw, pos)
        pos += 4
        if rlen < 0 or rlen > end - pos:
            raise RemoteProtocolError(f"remark length {rlen} does not fit the header")
        remark = raw[pos : pos + rlen].decode() if rlen else None
        pos += rlen
        (flen,) = _I32.unpack_from(raw, pos)
        pos += 4
        if flen < 0 or flen > end - pos:
            raise RemoteProtocolError(f"extFields length {flen} does not fit the header")
        ext: dict[str, str] = {}
        stop = pos + flen
        while pos < stop:
            (klen,) = _I16.unpack_from(raw, pos)
            pos += 2
            if klen < 0 or klen > stop - pos:
                raise RemoteProtocolError(f"extFields key length {klen} overruns the fields")
            key = raw[pos : pos + klen].decode()
            pos += klen
            (vlen,) = _I32.unpack_from(raw, pos)
            pos += 4
            if vlen < 0 or vlen > stop - pos:
                raise RemoteProtocolError(f"extFields value length {vlen} overruns the fields")
            ext[key] = raw[pos : pos + vlen].decode()
            pos += vlen
    except struct.error:
        raise RemoteProtocolError("binary header is truncated") from None
    except UnicodeDecodeError as exc:
        raise RemoteProtocolError(f"binary header string is not UTF-8: {exc}") from None
    # Bytes after extFields are ignored, as RocketMQ does.
    return code, _LANGUAGE_NAMES.get(lang, "OTHER"), version, opaque, flag, remark, ext


def _decode_frame(mv: memoryview, start: int, length: int) -> RemotingCommand:
    """Decode the frame whose header word starts at ``start``; ``length`` is its length field."""
    (word,) = _U32.unpack_from(mv, start)
    serialize_type, header_length = word >> 24, word & 0xFFFFFF
    if header_length > length - 4:
        raise RemoteProtocolError(f"header length {header_length} exceeds frame length {length}")
    header_start = start + 4
    body_start = header_start + header_length
    header = mv[header_start:body_start]
    if serialize_type == 0:  # SerializeType.JSON
        fields = _decode_json_header(header)
        stype = _JSON
    elif serialize_type == 1:  # SerializeType.ROCKETMQ
        fields = _decode_binary_header(header)
        stype = _ROCKETMQ
    else:
        raise RemoteProtocolError(f"unknown serialize type {serialize_type}")
    header.release()
    end = start + length
    body = bytes(mv[body_start:end]) if end > body_start else b""
    code, language, version, opaque, flag, remark, ext = fields
    return _command(code, language, version, opaque, flag, remark, ext, body, stype)


def take_frames(data: bytes, take: Callable[[bytes], bool]) -> int:
    """Hand ``take`` each whole frame at the start of ``data`` (a received chunk, nothing buffered before it), in
    order, until it refuses one (returns False) or only part of a frame is left; how many bytes it took. The fast
    paths of both sides (broker/send_fast.py, client/wire.py) serve what they can this way and leave the rest, in
    order, to a ``FrameDecoder``. A chunk that is exactly one frame is handed over as it is (no copy)."""
    n = len(data)
    if n >= 4 and int.from_bytes(data[:4], "big") + 4 == n:
        return n if take(data) else 0
    pos = 0
    while n - pos >= 8:
        end = pos + 4 + int.from_bytes(data[pos:pos + 4], "big")
        if end > n or not take(data[pos:end]):
            break
        pos = end
    return pos


class FrameDecoder:
    """Incremental frame decoder: ``feed()`` bytes as they arrive, get whole commands back.

    Partial frames are kept in one bytearray that is appended to and trimmed from the front (both amortised
    O(1) in CPython), and nothing is re-parsed until enough bytes for the next frame are there, so a large
    frame arriving in many small pieces costs linear time. After a ``RemoteProtocolError`` the stream has lost
    framing, so every later ``feed()`` raises too; frames decoded earlier in the failing call are discarded.
    Any bytes at all either decode or raise ``RemoteProtocolError`` (tests/protocol/test_remoting_fuzz.py).
    """

    __slots__ = ("_buf", "_failed", "_max_frame_size", "_need")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        if max_frame_size < 8:
            raise ValueError("max_frame_size must leave room for the header word")
        self._max_frame_size = max_frame_size
        self._buf = bytearray()
        self._need = 4  # bytes the buffer must hold before another frame can complete
        self._failed = False

    @property
    def buffered(self) -> int:
        """Bytes held for a frame not yet complete."""
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[RemotingCommand]:
        if self._failed:
            raise RemoteProtocolError("frame decoder already failed")
        buf = self._buf
        if buf:
            buf += data
            if len(buf) < self._need:
                return []
            source: bytes | bytearray | memoryview = buf
        else:
            source = data  # common case: no leftover, decode straight from the received chunk
        frames: list[RemotingCommand] = []
        try:
            with memoryview(source) as mv:
                pos, end = 0, len(mv)
                need = 4
                while end - pos >= 4:
                    (length,) = _U32.unpack_from(mv, pos)
                    if length < 4:
                        raise RemoteProtocolError(f"frame length {length} is shorter than the header word")
                    if length > self._max_frame_size:
                        raise RemoteProtocolError(f"frame length {length} exceeds the limit {self._max_frame_size}")
                    if end - pos - 4 < length:
                        need = 4 + length
                        break
                    frames.append(_decode_frame(mv, pos + 4, length))
                    pos += 4 + length
                rest = None if source is buf else bytes(mv[pos:]) if pos < end else None
        except RemoteProtocolError:
            self._failed = True
            self._buf = bytearray()
            raise
        if source is buf:
            del buf[:pos]
        elif rest:
            buf += rest
        self._need = need
        return frames


def decode(
    frame: bytes | bytearray | memoryview, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
) -> RemotingCommand:
    """Decode exactly one complete frame (length prefix included)."""
    decoder = FrameDecoder(max_frame_size)
    frames = decoder.feed(frame)
    if len(frames) != 1 or decoder.buffered:
        raise RemoteProtocolError(
            f"expected exactly one frame, got {len(frames)} and {decoder.buffered} spare bytes"
        )
    return frames[0]
