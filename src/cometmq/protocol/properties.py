"""Message properties: ``name 0x01 value 0x02`` per pair, as RocketMQ stores them."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from operator import methodcaller

from cometmq.protocol.errors import LocalProtocolError, RemoteProtocolError

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
MAX_PROPERTIES_LENGTH = 32767  # the stored length is a signed int16

# Well-known property keys (RocketMQ MessageConst).
TAGS = "TAGS"
KEYS = "KEYS"
WAIT = "WAIT"
DELAY = "DELAY"
UNIQ_KEY = "UNIQ_KEY"
RETRY_TOPIC = "RETRY_TOPIC"
REAL_TOPIC = "REAL_TOPIC"
REAL_QID = "REAL_QID"
TRAN_MSG = "TRAN_MSG"
PGROUP = "PGROUP"
MIN_OFFSET = "MIN_OFFSET"
MAX_OFFSET = "MAX_OFFSET"
ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
RECONSUME_TIME = "RECONSUME_TIME"
MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
TIMER_DELAY_MS = "TIMER_DELAY_MS"


def encode_properties(props: Mapping[str, str]) -> bytes:
    """Encode a mapping; names must be non-empty and neither names nor values may hold a separator."""
    if not props:
        return b""
    parts = []
    for name, value in props.items():
        if not name:  # decode_properties drops nameless pairs, so refuse to write one
            raise LocalProtocolError("property with an empty name")
        if (
            NAME_VALUE_SEPARATOR in name
            or PROPERTY_SEPARATOR in name
            or NAME_VALUE_SEPARATOR in value
            or PROPERTY_SEPARATOR in value
        ):
            raise LocalProtocolError(f"property {name!r} contains a reserved separator character")
        parts.append(f"{name}\x01{value}\x02")
    try:
        return "".join(parts).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate, e.g. from a JSON "\ud800" escape
        raise LocalProtocolError("properties cannot be encoded as UTF-8") from None


_split_pair = methodcaller("split", NAME_VALUE_SEPARATOR, 1)


def decode_properties(data: bytes | bytearray | memoryview) -> dict[str, str]:
    """Decode stored properties. Pairs without a name/value separator are ignored, as RocketMQ does."""
    if not data:
        return {}
    try:
        text = (data if type(data) is bytes else bytes(data)).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RemoteProtocolError(f"properties are not valid UTF-8: {exc}") from None
    # Fast path (this runs once per message on the send and pull paths): every pair well formed. A pair
    # without a separator makes dict() raise ValueError, a nameless one leaves the key "": both take the
    # careful path below, which gives the same result for well-formed input.
    items = text.split(PROPERTY_SEPARATOR)
    if not items[-1]:
        items.pop()
    try:
        result = dict(map(_split_pair, items))
    except ValueError:
        return _decode_lenient(items)
    if "" in result:
        return _decode_lenient(items)
    return result


def _decode_lenient(items: list[str]) -> dict[str, str]:
    result: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition(NAME_VALUE_SEPARATOR)
        if sep and name:
            result[name] = value
    return result


class RawProperties(Mapping[str, str]):
    """Encoded properties read without decoding all of them: ``get`` of one name searches the bytes.

    The broker's send path keeps a plain message's properties this way: the store needs only TAGS (tag code)
    and the index only UNIQ_KEY and KEYS, so decoding every pair of every message into a dict (about 2 µs a
    message, a fifth of the broker's time on batched sends) is skipped. Anything else (iteration, ``[]``,
    ``len``) decodes once, with ``decode_properties``'s semantics; ``get`` answers the same (the last pair of
    a name wins, pairs without a separator are ignored). Read-only. ``raw`` must be valid UTF-8 (see
    ``check_utf8``)."""

    __slots__ = ("_dict", "raw")

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self._dict: dict[str, str] | None = None

    def decoded(self) -> dict[str, str]:
        d = self._dict
        if d is None:
            d = self._dict = decode_properties(self.raw)
        return d

    def get(self, name: str, default: str | None = None) -> str | None:  # type: ignore[override]
        d = self._dict
        if d is not None:
            return d.get(name, default)
        raw = self.raw
        key = _NEEDLES.get(name)
        if key is None:
            key = name.encode("utf-8", "surrogatepass") + b"\x01"
        i = raw.rfind(key)
        # A match must start a pair: at the start or right after a pair separator (values hold no 0x01, so
        # "TAGS\x01" inside a value cannot occur; "XTAGS\x01" is another name).
        while i > 0 and raw[i - 1] != 2:
            i = raw.rfind(key, 0, i)
        if i < 0 or not name:
            return default
        start = i + len(key)
        end = raw.find(b"\x02", start)
        return (raw[start:] if end < 0 else raw[start:end]).decode("utf-8")

    def __getitem__(self, name: str) -> str:
        return self.decoded()[name]

    def __contains__(self, name: object) -> bool:
        return name in self.decoded()

    def __iter__(self) -> Iterator[str]:
        return iter(self.decoded())

    def __len__(self) -> int:
        return len(self.decoded())

    def __repr__(self) -> str:
        return f"RawProperties({self.decoded()!r})"


_NEEDLES = {name: name.encode() + b"\x01" for name in (TAGS, KEYS, UNIQ_KEY)}


def check_utf8(raw: bytes) -> None:
    """Raise RemoteProtocolError unless ``raw`` is UTF-8 (what ``decode_properties`` would refuse)."""
    if not raw.isascii():
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RemoteProtocolError(f"properties are not valid UTF-8: {exc}") from None
