"""fastjson's text, written and read (sans-I/O): what RocketMQ's Java tools put in admin bodies.

The writer follows fastjson 1.x's defaults (a ``Bean``'s properties in alphabetical order, nulls left out, Java's
``Double.toString`` for doubles, ``Integer`` map keys bare, ``MessageQueue`` map keys as the queue object itself);
the parser reads that (JSON, plus objects and bare numbers as keys), bounded in depth, and raises
``RemoteProtocolError`` naming the body and where it went wrong. The shapes themselves are in admin_bodies.py.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NoReturn

from cometmq.protocol.client_bodies import MessageQueue
from cometmq.protocol.errors import RemoteProtocolError

#: Deepest nesting the parser follows (admin bodies nest 5 levels at most).
MAX_DEPTH = 64


# -- the writer -----------------------------------------------------------------------------------------------
class Bean(dict[str, Any]):
    """A Java bean's properties: written in alphabetical order, None left out (fastjson's defaults)."""


def bean(**props: Any) -> Bean:
    return Bean(props)


def java_double(value: float) -> str:
    """``value`` as Java's ``Double.toString`` (and fastjson's Ryu writer) spell it: shortest digits, ``.0`` on
    whole numbers, scientific (``1.0E-4``, ``1.2345E7``) below 1e-3 and from 1e7 on. NaN and infinities have
    no JSON form: fastjson writes ``null``."""
    if math.isnan(value) or math.isinf(value):
        return "null"
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    from decimal import Decimal  # only doubles need it (admin stats bodies), not a server's idle path

    sign, digits, exp = Decimal(repr(value)).as_tuple()
    assert isinstance(exp, int)
    text = "".join(map(str, digits)).rstrip("0") or "0"
    # value = 0.<text> * 10**point
    point = len(digits) + exp
    minus = "-" if sign else ""
    if 1e-3 <= abs(value) < 1e7:
        if point <= 0:
            return f"{minus}0.{'0' * -point}{text}"
        if point >= len(text):
            return f"{minus}{text}{'0' * (point - len(text))}.0"
        return f"{minus}{text[:point]}.{text[point:]}"
    mantissa = f"{text[0]}.{text[1:] or '0'}"
    return f"{minus}{mantissa}E{point - 1}"


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_NEEDS_ESCAPE = re.compile(r'["\\\x00-\x1f]')


def _string(s: str) -> str:
    def one(m: re.Match[str]) -> str:
        c = m.group()
        return _ESCAPES.get(c) or f"\\u{ord(c):04X}"

    return '"' + _NEEDS_ESCAPE.sub(one, s) + '"'


def _mq_bean(mq: MessageQueue) -> Bean:
    return bean(brokerName=mq.broker_name, queueId=mq.queue_id, topic=mq.topic)


def _write(value: Any, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        out.append(str(value))
    elif isinstance(value, float):
        out.append(java_double(value))
    elif isinstance(value, str):
        out.append(_string(value))
    elif isinstance(value, MessageQueue):
        _write(_mq_bean(value), out)
    elif isinstance(value, Bean):
        out.append("{")
        first = True
        for key in sorted(value):
            item = value[key]
            if item is None:
                continue
            if not first:
                out.append(",")
            first = False
            out.append(_string(key))
            out.append(":")
            _write(item, out)
        out.append("}")
    elif isinstance(value, Mapping):
        out.append("{")
        first = True
        for key, item in value.items():
            if item is None:
                continue
            if not first:
                out.append(",")
            first = False
            if isinstance(key, str):
                out.append(_string(key))
            elif isinstance(key, int) and not isinstance(key, bool):
                out.append(str(key))  # fastjson writes Integer/Long keys bare
            elif isinstance(key, MessageQueue):
                _write(_mq_bean(key), out)  # ... and bean keys as the bean itself
            else:
                raise TypeError(f"cannot write a map key of type {type(key).__name__}")
            out.append(":")
            _write(item, out)
        out.append("}")
    elif isinstance(value, (list, tuple)):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _write(item, out)
        out.append("]")
    elif isinstance(value, (set, frozenset)):
        _write(sorted(value), out)
    else:
        raise TypeError(f"cannot write a {type(value).__name__} as fastjson")


def fastjson_dumps(value: Any) -> bytes:
    """``value`` as fastjson writes it (see the module doc): ``Bean`` = a Java object, other mappings = maps."""
    out: list[str] = []
    _write(value, out)
    return "".join(out).encode("utf-8")


def sorted_queue_map(table: Mapping[MessageQueue, Any]) -> dict[MessageQueue, Any]:
    return {mq: table[mq] for mq in sorted(table)}


# -- the parser -----------------------------------------------------------------------------------------------
class ObjectKey(Mapping[str, Any]):
    """A map key that was an object (fastjson's ``{{"brokerName":...}:...}``): a frozen, hashable mapping."""

    __slots__ = ("_data", "_hash")

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._data = dict(data)
        self._hash = hash(tuple(sorted((k, _freeze(v)) for k, v in self._data.items())))

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectKey) and self._data == other._data

    def __repr__(self) -> str:
        return f"ObjectKey({self._data!r})"


def _freeze(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return ObjectKey(value)
    return value


#: the stdlib's (C) JSON string scanner: (text, index after the opening quote, strict) -> (string, end)
_scanstring: Callable[[str, int, bool], tuple[str, int]] = getattr(json.decoder, "scanstring")  # noqa: B009
_WS = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")


class _Parser:
    def __init__(self, text: str, what: str) -> None:
        self.text = text
        self.what = what
        self.pos = 0

    def fail(self, message: str) -> NoReturn:
        near = self.text[self.pos:self.pos + 20]
        raise RemoteProtocolError(f"{self.what}: {message} at offset {self.pos} (near {near!r})")

    def skip(self) -> str:
        m = _WS.match(self.text, self.pos)
        assert m is not None
        self.pos = m.end()
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def document(self) -> Any:
        value = self.value(0)
        if self.skip():
            self.fail("unexpected text after the body")
        return value

    def value(self, depth: int) -> Any:
        c = self.skip()
        if c == "{":
            return self.object(depth + 1)
        if c == "[":
            return self.array(depth + 1)
        if c == '"':
            return self.string()
        if c == "-" or c.isdigit():
            return self.number()
        for word, result in (("true", True), ("false", False), ("null", None)):
            if self.text.startswith(word, self.pos):
                self.pos += len(word)
                return result
        self.fail("expected a value" if c else "the body ends where a value should be")

    def string(self) -> str:
        try:
            s, self.pos = _scanstring(self.text, self.pos + 1, True)
        except ValueError as exc:
            self.fail(f"bad string ({exc.args[0].split(':')[0]})")
        return s

    def number(self) -> int | float:
        m = _NUMBER.match(self.text, self.pos)
        if m is None:
            self.fail("bad number")
        self.pos = m.end()
        try:
            return float(m.group()) if m.group(1) or m.group(2) else int(m.group())
        except ValueError:  # more digits than int() takes
            self.fail("number too long")

    def object(self, depth: int) -> dict[Any, Any]:
        if depth > MAX_DEPTH:
            self.fail(f"nested deeper than {MAX_DEPTH} levels")
        self.pos += 1
        out: dict[Any, Any] = {}
        if self.skip() == "}":
            self.pos += 1
            return out
        while True:
            c = self.skip()
            key: Any
            if c == '"':
                key = self.string()
            elif c == "{":  # a bean as key: fastjson's Map<MessageQueue, ...>
                key = ObjectKey(self.object(depth + 1))
            elif c == "-" or c.isdigit():  # fastjson's Map<Integer, ...>: read as the quoted form reads
                number = self.number()
                if not isinstance(number, int):
                    self.fail("a number key must be an integer")
                key = str(number)
            else:
                self.fail("expected a key" if c else "the body ends inside an object")
            if self.skip() != ":":
                self.fail("expected ':' after a key")
            self.pos += 1
            out[key] = self.value(depth)
            c = self.skip()
            self.pos += 1
            if c == "}":
                return out
            if c != ",":
                self.pos -= 1
                self.fail("expected ',' or '}' in an object" if c else "the body ends inside an object")

    def array(self, depth: int) -> list[Any]:
        if depth > MAX_DEPTH:
            self.fail(f"nested deeper than {MAX_DEPTH} levels")
        self.pos += 1
        out: list[Any] = []
        if self.skip() == "]":
            self.pos += 1
            return out
        while True:
            out.append(self.value(depth))
            c = self.skip()
            self.pos += 1
            if c == "]":
                return out
            if c != ",":
                self.pos -= 1
                self.fail("expected ',' or ']' in an array" if c else "the body ends inside an array")


def parse_fastjson(data: bytes | bytearray | memoryview | str, what: str) -> Any:
    """Parse a body fastjson wrote: JSON, plus objects and bare integers as object keys (an object key becomes
    an ``ObjectKey``, a number key its decimal string). Raises ``RemoteProtocolError`` naming ``what``."""
    if isinstance(data, str):
        text = data
    else:
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RemoteProtocolError(f"{what} is not UTF-8: {exc}") from None
    if not text.strip():
        raise RemoteProtocolError(f"{what}: the body is empty")
    try:  # plain JSON (most bodies): the C parser
        return json.loads(text)
    except (ValueError, RecursionError):
        pass
    return _Parser(text, what).document()
