"""One lone send frame read in one step: what the broker's fast path for a single send needs of it.

``decode_send_v2(data, max_frame_size)`` takes one whole frame of SEND_MESSAGE_V2 (310: the Java and SDK clients'
single send, its header's keys one letter each) or SEND_MESSAGE (10: the C++ client's, the header's keys by name,
some of its values JSON numbers) and returns ``(code, opaque, topic, queue_id, sys_flag, born_timestamp, flag,
properties, reconsume_times, body)``, or None for anything else: another request code, a oneway or response frame, a
binary header, more or less than one frame, a header field the header parser would refuse or read in another way (a
long key name in a V2 header, a number that ``int()`` reads but that is not plain decimal digits, a number outside
its field's Java type (``headers.field_ranges``), a boolean other than true/false/1/0/empty, a null), a batch, any
JSON this reader is not sure of. None costs nothing but the try: the caller hands the bytes to the generic decoder
(``remoting.FrameDecoder``) and header parser (``SendProcessor.send``'s choice of ``headers.send_header_from_v2`` or
``SendMessageRequestHeader.from_ext``), which answer as they always did. So every frame this reader takes, the
generic path would have decoded to the same values.

The optional C helper ``cometmq.protocol._sendv2c`` reads the JSON itself (one call instead of the header codec, a
header dict, a RemotingCommand and the generated header parser); ``decode_send_v2_py`` below is the reference and
the fallback. tests/protocol/test_send_v2.py compares them.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Callable
from typing import Any

from cometmq.common.native import load_c_helper
from cometmq.protocol.codes import RequestCode
from cometmq.protocol.headers import V2_LETTERS, SendMessageRequestHeader, field_ranges

SendV2 = tuple[int, int, str, int, int, int, int, str, int, bytes]
"""code, opaque, topic, queue_id, sys_flag, born_timestamp, flag, properties, reconsume_times, body"""

_PREFIX = struct.Struct(">II")
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_DIGITS = re.compile(r"-?[0-9]{1,18}\Z")
_BOOLS = {"true": True, "1": True, "false": False, "0": False, "": False}
_LONG_KEYS = frozenset(V2_LETTERS)
_LETTERS = frozenset("abcdefghijklm")
#: each numeric field's letter, default and range (its Java type's: bornTimestamp a long, the others ints)
_NUMS = tuple((V2_LETTERS[key], default, *field_ranges(SendMessageRequestHeader)[key]) for key, default in (
    ("defaultTopicQueueNums", 4), ("queueId", -1), ("sysFlag", 0), ("bornTimestamp", 0), ("flag", 0),
    ("reconsumeTimes", 0), ("maxReconsumeTimes", 0)))
#: a SEND_MESSAGE (V1) header's keys by kind (``SendMessageRequestHeader``'s fields by their wire names)
_V1_STRS = frozenset({"producerGroup", "topic", "defaultTopic", "properties"})
_V1_BOOLS = frozenset({"unitMode", "batch"})
_TOP_INTS = ("code", "opaque", "flag", "version")
_KNOWN_TOP = frozenset((*_TOP_INTS, "language", "remark", "extFields"))
_SEND_V2 = int(RequestCode.SEND_MESSAGE_V2)
_SEND_V1 = int(RequestCode.SEND_MESSAGE)


class _Pairs(list[tuple[str, Any]]):
    """A JSON object as its pairs, in order, duplicates kept."""


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _scalar(value: Any) -> bool:
    """A value the reader skips when it names no field it uses: a string, an integer (of at most 18 digits: the
    JSON text of a bigger one is longer), true, false or null."""
    if value is None or type(value) is bool:
        return True
    if type(value) is str:
        return not _has_surrogate(value)
    return type(value) is int and len(str(abs(value))) <= 18


def decode_send_v2_py(data: bytes | bytearray | memoryview, max_frame_size: int) -> SendV2 | None:
    """The reference of the C helper's ``decode`` (see the module's docstring)."""
    n = len(data)
    if n < 8:
        return None
    length, word = _PREFIX.unpack_from(data, 0)
    hlen = word & 0xFFFFFF
    if length != n - 4 or length > max_frame_size or word >> 24 or hlen > length - 4:
        return None
    try:
        text = str(bytes(data[8:8 + hlen]), "utf-8")
        top = json.loads(text, object_pairs_hook=_Pairs, parse_float=_no_float, parse_constant=_no_float)
    except (ValueError, RecursionError):
        return None
    if type(top) is not _Pairs or not top:
        return None
    fields: dict[str, Any] = {}
    for key, value in top:
        if _has_surrogate(key):
            return None
        if key in _KNOWN_TOP:
            if key in fields:
                return None
            fields[key] = value
        elif not _scalar(value):
            return None
    ints = []
    for key in _TOP_INTS:
        value = fields.get(key, 0)
        if key not in fields and key == "code":
            return None
        if type(value) is not int or not _INT32_MIN <= value <= _INT32_MAX:
            return None
        ints.append(value)
    code, opaque, flag, _version = ints
    language = fields.get("language", "")
    remark = fields.get("remark")
    if type(language) is not str or _has_surrogate(language):
        return None
    if remark is not None and (type(remark) is not str or _has_surrogate(remark)):
        return None
    pairs = fields.get("extFields")
    if type(pairs) is not _Pairs or code not in (_SEND_V2, _SEND_V1) or flag & 3:
        return None
    ext = _ext_v2(pairs) if code == _SEND_V2 else _ext_v1(pairs)
    if ext is None or "a" not in ext or "b" not in ext:
        return None
    nums: dict[str, int] = {}
    for key, default, lo, hi in _NUMS:
        raw = ext.get(key)
        if raw is None:
            nums[key] = default
        elif _DIGITS.match(raw) and lo <= (n := int(raw)) <= hi:
            nums[key] = n
        else:
            return None
    if ext.get("k", "") not in _BOOLS or _BOOLS.get(ext.get("m", ""), True):
        return None
    body = bytes(data[8 + hlen:])
    return (code, opaque, ext["b"], nums["e"], nums["f"], nums["g"], nums["h"], ext.get("i", ""), nums["j"], body)


def _ext_v2(pairs: _Pairs) -> dict[str, str] | None:
    """A V2 header's fields by letter: string values only, each letter once, none of the long names (the V2
    parser reads one when its letter is absent)."""
    ext: dict[str, str] = {}
    for key, value in pairs:
        if type(value) is not str or _has_surrogate(key) or _has_surrogate(value):
            return None
        if key in _LETTERS:
            if key in ext:
                return None
            ext[key] = value
        elif key in _LONG_KEYS:
            return None
    return ext


def _ext_v1(pairs: _Pairs) -> dict[str, str] | None:
    """A V1 header's fields, by the letters V2 gives them: each name once; string fields strings, the others
    strings, integers or (the booleans) true/false, as the generic decoder turns them into strings; other keys any
    scalar but null. The V1 parser is the generic path's only with ``topic`` present (``SendProcessor.send``)."""
    ext: dict[str, str] = {}
    for key, value in pairs:
        if _has_surrogate(key) or value is None or not _scalar(value):
            return None
        letter = V2_LETTERS.get(key)
        if letter is None:
            continue
        if letter in ext:
            return None
        if type(value) is str:
            ext[letter] = value
        elif key in _V1_STRS:
            return None
        elif type(value) is bool:
            if key not in _V1_BOOLS:
                return None
            ext[letter] = "true" if value else "false"
        else:
            ext[letter] = str(value)
    return ext


def _no_float(text: str) -> Any:
    raise ValueError(f"not an integer: {text}")


_C_HELPER: Any = load_c_helper("cometmq.protocol._sendv2c")

#: what the broker uses: C when built, else the reference
decode_send_v2: Callable[[bytes | bytearray | memoryview, int], SendV2 | None] = (
    _C_HELPER.decode if _C_HELPER is not None else decode_send_v2_py)
