"""Message properties: ``name 0x01 value 0x02`` per pair, as RocketMQ stores them."""

from __future__ import annotations

from collections.abc import Mapping
from operator import methodcaller

from cometmq.protocol.errors import ProtocolError

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
            raise ProtocolError("property with an empty name")
        if (
            NAME_VALUE_SEPARATOR in name
            or PROPERTY_SEPARATOR in name
            or NAME_VALUE_SEPARATOR in value
            or PROPERTY_SEPARATOR in value
        ):
            raise ProtocolError(f"property {name!r} contains a reserved separator character")
        parts.append(f"{name}\x01{value}\x02")
    try:
        return "".join(parts).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate, e.g. from a JSON "\ud800" escape
        raise ProtocolError("properties cannot be encoded as UTF-8") from None


_split_pair = methodcaller("split", NAME_VALUE_SEPARATOR, 1)


def decode_properties(data: bytes | bytearray | memoryview) -> dict[str, str]:
    """Decode stored properties. Pairs without a name/value separator are ignored, as RocketMQ does."""
    if not data:
        return {}
    try:
        text = (data if type(data) is bytes else bytes(data)).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"properties are not valid UTF-8: {exc}") from None
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
