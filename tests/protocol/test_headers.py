"""The generated header parsers and writers agree with the plain field-by-field loop they replace."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cometmq.protocol import headers as H
from cometmq.protocol import pop as P
from cometmq.protocol.errors import ProtocolError


def _all_header_classes() -> list[type[H.Header]]:
    found: set[type[H.Header]] = set()
    for module in (H, P):
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, H.Header) and value is not H.Header:
                found.add(value)
    return sorted(found, key=lambda c: c.__name__)


HEADERS = _all_header_classes()


def reference_from_ext(cls: type[H.Header], ext: Mapping[str, str]) -> H.Header:
    """The straightforward parser: every field in order, ``cls(**values)``."""
    values: dict[str, Any] = {}
    for name, key, kind, required in H._spec(cls):
        raw = ext.get(key)
        if raw is None:
            if required:
                raise ProtocolError(f"header field {key!r} is missing")
            continue
        try:
            values[name] = int(raw) if kind == "int" else H.parse_bool(raw) if kind == "bool" else raw
        except ValueError:
            raise ProtocolError(f"header field {key!r} has a bad value {raw!r}") from None
    return cls(**values)


def reference_to_ext(header: H.Header) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, key, kind, _required in H._spec(type(header)):
        value = getattr(header, name)
        if value is not None:
            out[key] = ("true" if value else "false") if kind == "bool" else str(value)
    return out


def _outcome(fn: Any, *args: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(*args)
    except ProtocolError as exc:
        return "error", str(exc)


# Values of every kind a peer may send for a field: numbers (signed, padded, huge), booleans in the spellings
# RocketMQ clients use, and junk.
_VALUES = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.integers(-5, 5).map(lambda i: f" {i} "),
    st.sampled_from(["true", "false", "TRUE", " 1", "0", "", "yes", "1.5", "0x10", "1_000", "\u0663"]),
    st.text(max_size=12),
)


@pytest.mark.parametrize("cls", HEADERS, ids=lambda c: c.__name__)
@given(data=st.data())
def test_generated_parser_matches_the_reference(cls: type[H.Header], data: st.DataObject) -> None:
    keys = [key for _, key, _, _ in H._spec(cls)]
    ext = data.draw(st.dictionaries(st.sampled_from([*keys, "unrelated"]), _VALUES, max_size=len(keys) + 1))
    # Half the time start from a complete header, so that the conversions themselves get exercised.
    if data.draw(st.booleans()):
        complete = {key: data.draw(st.sampled_from(["7", "true", "x"])) for key in keys}
        ext = {**complete, **ext}
    assert _outcome(cls.from_ext, ext) == _outcome(reference_from_ext, cls, ext)


@pytest.mark.parametrize("cls", HEADERS, ids=lambda c: c.__name__)
def test_generated_writer_matches_the_reference_and_round_trips(cls: type[H.Header]) -> None:
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        kind = next(s[2] for s in H._spec(cls) if s[0] == f.name)
        values[f.name] = 41 if kind == "int" else True if kind == "bool" else f"v-{f.name}"
    header = cls(**values)
    assert header.to_ext() == reference_to_ext(header)
    assert cls.from_ext(header.to_ext()) == header
    # fields left at None are left out
    optional_none = {f.name: None for f in dataclasses.fields(cls)
                     if f.default is None}
    if optional_none:
        sparse = dataclasses.replace(header, **optional_none)
        assert sparse.to_ext() == reference_to_ext(sparse)


def test_send_v2_takes_the_letter_or_the_full_name() -> None:
    full = H.SendMessageRequestHeader(producer_group="PG", topic="T", queue_id=3, sys_flag=0, born_timestamp=9,
                                      properties="a\x01b\x02", batch=True)
    v2 = H.send_header_to_v2(full)
    assert v2 == {H.V2_LETTERS.get(k, k): v for k, v in full.to_ext().items()}
    assert H.send_header_from_v2(v2) == full
    mixed = dict(v2)
    mixed["topicX"] = "ignored"
    mixed["topic"] = mixed.pop("b")  # a peer that spells one field out
    assert H.send_header_from_v2(mixed) == full
    with pytest.raises(ProtocolError, match="'producerGroup' is missing"):
        H.send_header_from_v2({"b": "T"})
    with pytest.raises(ProtocolError, match="'queueId' has a bad value 'x'"):
        H.send_header_from_v2({**v2, "e": "x"})
