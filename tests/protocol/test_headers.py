"""The generated header parsers and writers agree with the plain field-by-field loop they replace; each numeric
field is bounded by its Java type in RocketMQ's header class."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cometmq.protocol import headers as H
from cometmq.protocol import pop as P
from cometmq.protocol.errors import ProtocolError, RemoteProtocolError


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
            values[name] = int(raw) if kind in H.RANGES else H.parse_bool(raw) if kind == "bool" else raw
        except ValueError:
            raise ProtocolError(f"header field {key!r} has a bad value {raw!r}") from None
        if kind in H.RANGES and not H.RANGES[kind][0] <= values[name] <= H.RANGES[kind][1]:
            raise H._out_of_range(key, raw, kind)
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
    st.sampled_from([2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1]).map(str),
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
        values[f.name] = 41 if kind in H.RANGES else True if kind == "bool" else f"v-{f.name}"
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


#: The fields RocketMQ's header classes declare ``long`` / ``Long`` (apache/rocketmq,
#: remoting/src/main/java/org/apache/rocketmq/remoting/protocol/header/*.java; TopicQueueHeader stands for
#: GetMaxOffset-, GetMinOffset- and GetEarliestMsgStoretimeRequestHeader). Every other numeric field is an ``int`` /
#: ``Integer`` there.
JAVA_LONGS: dict[str, set[str]] = {
    "SendMessageRequestHeader": {"bornTimestamp"},
    "SendMessageResponseHeader": {"queueOffset"},
    "PullMessageRequestHeader": {"queueOffset", "commitOffset", "suspendTimeoutMillis", "subVersion"},
    "PullMessageResponseHeader": {"suggestWhichBrokerId", "nextBeginOffset", "minOffset", "maxOffset"},
    "UpdateConsumerOffsetRequestHeader": {"commitOffset"},
    "SearchOffsetRequestHeader": {"timestamp"},
    "ViewMessageRequestHeader": {"offset"},
    "QueryMessageRequestHeader": {"beginTimestamp", "endTimestamp"},
    "ConsumerSendMsgBackRequestHeader": {"offset"},
    "EndTransactionRequestHeader": {"tranStateTableOffset", "commitLogOffset"},
    "CheckTransactionStateRequestHeader": {"tranStateTableOffset", "commitLogOffset"},
    "PopMessageRequestHeader": {"invisibleTime", "pollTime", "bornTime"},
    "PopMessageResponseHeader": {"popTime", "invisibleTime", "restNum"},
    "AckMessageRequestHeader": {"offset"},
    "ChangeInvisibleTimeRequestHeader": {"offset", "invisibleTime"},
    "ChangeInvisibleTimeResponseHeader": {"popTime", "invisibleTime"},
    "NotificationRequestHeader": {"pollTime", "bornTime"},
}


@pytest.mark.parametrize("cls", HEADERS, ids=lambda c: c.__name__)
def test_numeric_fields_have_their_java_type(cls: type[H.Header]) -> None:
    ranges = H.field_ranges(cls)
    assert {key for key, r in ranges.items() if r == H.RANGES["long"]} == JAVA_LONGS.get(cls.__name__, set())
    assert set(ranges.values()) <= {H.RANGES["int"], H.RANGES["long"]}


_NUMERIC_FIELDS = [(cls, key) for cls in HEADERS for key in H.field_ranges(cls)]


@pytest.mark.parametrize(("cls", "key"), _NUMERIC_FIELDS, ids=[f"{c.__name__}.{k}" for c, k in _NUMERIC_FIELDS])
def test_a_number_past_its_java_type_is_refused(cls: type[H.Header], key: str) -> None:
    lo, hi = H.field_ranges(cls)[key]
    kind = "long" if (lo, hi) == H.RANGES["long"] else "int"
    assert (lo, hi) == ((-(2**63), 2**63 - 1) if kind == "long" else (-(2**31), 2**31 - 1))
    complete = {k: "true" if kind_ == "bool" else "7" if kind_ in H.RANGES else "s"
                for _, k, kind_, _ in H._spec(cls)}
    name = next(n for n, k, _, _ in H._spec(cls) if k == key)
    for ok in (lo, hi):
        assert getattr(cls.from_ext({**complete, key: str(ok)}), name) == ok
    for bad in (hi + 1, lo - 1, 10**30):
        with pytest.raises(RemoteProtocolError) as info:
            cls.from_ext({**complete, key: str(bad)})
        assert str(info.value).startswith(f"header field {key!r} = '{str(bad)[:40]}")
        assert str(info.value).endswith(f"is out of range for a Java {kind} [{lo}, {hi}]")
    if cls is H.SendMessageRequestHeader:  # and by its V2 letter
        with pytest.raises(RemoteProtocolError, match=f"{key!r} = '{hi + 1}' is out of range"):
            H.send_header_from_v2({H.V2_LETTERS.get(k, k): v for k, v in {**complete, key: str(hi + 1)}.items()})


def test_a_plain_int_field_says_no_java_type_and_is_refused() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class Vague(H.Header):
        count: int

    with pytest.raises(TypeError, match=r"Vague\.count: annotate a header field JInt, JLong"):
        Vague.from_ext({"count": "1"})
