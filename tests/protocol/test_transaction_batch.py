"""The END_TRANSACTION_BATCH codecs: round trips, and a peer's garbage is a RemoteProtocolError, never another
exception."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cometmq.protocol.codes import RequestCode
from cometmq.protocol.errors import RemoteProtocolError
from cometmq.protocol.transaction_batch import (
    MAX_END_ENTRIES,
    EndEntry,
    EndOutcome,
    decode_end_entries,
    decode_end_outcomes,
    encode_end_entries,
    encode_end_outcomes,
)

OFFSETS = st.integers(0, (1 << 63) - 1)
entries = st.lists(st.builds(EndEntry, OFFSETS, st.integers(0, (1 << 62)), st.sampled_from([0, 8, 12]),
                             st.text(max_size=40), st.integers(1, 3000)), max_size=20)
outcomes = st.lists(st.builds(EndOutcome, st.integers(-(1 << 31), (1 << 31) - 1), st.text(max_size=60),
                              st.integers(-1, 5000)), max_size=20)
json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
                           max_leaves=12)


def test_the_code_is_a_cometmq_extension_in_int16() -> None:
    assert RequestCode.END_TRANSACTION_BATCH == 31000 + RequestCode.END_TRANSACTION < 1 << 15


def test_known_encoding() -> None:
    assert encode_end_entries([EndEntry(1024, 3, 8, "ID")]) == b'{"entries":[[1024,3,8,"ID"]]}'
    assert decode_end_outcomes(b'{"results":[[0,""],[4,"no"]]}') == [EndOutcome(0), EndOutcome(4, "no")]


@given(entries)
def test_entries_round_trip(es: list[EndEntry]) -> None:
    assert decode_end_entries(encode_end_entries(es)) == es


@given(outcomes)
def test_outcomes_round_trip(os: list[EndOutcome]) -> None:
    assert decode_end_outcomes(encode_end_outcomes(os)) == os


@settings(max_examples=300)
@given(st.one_of(st.binary(max_size=64), json_values.map(lambda v: json.dumps(v).encode()),
                 st.lists(json_values, max_size=4).map(lambda v: json.dumps({"entries": v, "results": v}).encode())))
def test_garbage_is_a_remote_protocol_error(body: bytes) -> None:
    for decode in (decode_end_entries, decode_end_outcomes):
        try:
            decode(body)
        except RemoteProtocolError:
            pass


def test_refusals_name_the_problem() -> None:
    with pytest.raises(RemoteProtocolError, match="entry 1: commitOrRollback 5"):
        decode_end_entries(b'{"entries":[[1,2,8,""],[1,2,5,""]]}')
    with pytest.raises(RemoteProtocolError, match="non-negative int64"):
        decode_end_entries(b'{"entries":[[-1,2,8,""]]}')
    with pytest.raises(RemoteProtocolError, match="non-negative int64"):
        decode_end_entries(b'{"entries":[[true,2,8,""]]}')
    with pytest.raises(RemoteProtocolError, match="tranStateTableOffset"):
        decode_end_entries(b'{"entries":[[1,9223372036854775808,8,""]]}')
    with pytest.raises(RemoteProtocolError, match="at most"):
        decode_end_entries(encode_end_entries([EndEntry(0, 0, 8)] * (MAX_END_ENTRIES + 1)))
    assert EndOutcome(0, "the transaction is already resolved").already_resolved
    assert not EndOutcome(4, "already resolved").ok


def test_range_entries_and_their_outcomes() -> None:
    """A range entry is a single entry with a fifth element; its outcome a result with a third (halves decided
    before). Single entries and their results keep the four- and two-element forms."""
    body = encode_end_entries([EndEntry(10, 2, 8, "a"), EndEntry(20, 3, 12, "b", 7)])
    assert body == b'{"entries":[[10,2,8,"a"],[20,3,12,"b",7]]}'
    assert decode_end_entries(body)[1].count == 7
    assert encode_end_outcomes([EndOutcome(0, "x"), EndOutcome(0, "y", 3)]) == b'{"results":[[0,"x"],[0,"y",3]]}'
    ranged = decode_end_outcomes(b'{"results":[[0,"",2],[0,"",0],[4,"no",1]]}')
    assert [(o.ok, o.already_resolved, o.resolved_before) for o in ranged] == [(True, True, 2), (True, False, 0),
                                                                               (False, False, 1)]


@pytest.mark.parametrize(("body", "match"), [
    (b'{"entries":[[1,2,8,"",0]]}', "entry 0: count 0"),
    (b'{"entries":[[1,2,8,"",1.5]]}', "count 1.5"),
    (b'{"entries":[[1,9223372036854775800,8,"",100]]}', "past the largest offset"),
    # ranges count by their halves
    (encode_end_entries([EndEntry(0, 0, 8, "", MAX_END_ENTRIES), EndEntry(0, 0, 8)]), "halves: at most"),
    (b'{"results":[[0,"",-2]]}', "alreadyResolved"),
])
def test_range_refusals_name_the_problem(body: bytes, match: str) -> None:
    with pytest.raises(RemoteProtocolError, match=match):
        (decode_end_outcomes if b"results" in body else decode_end_entries)(body)
