"""The dispatcher's walk over raw records (store/record_walk.py, its C twin in store/_indexc.c) against the
reference it replaced: ``CommitLog.scan`` + ``dispatch_request_from_record`` record by record. Random logs
(topics, properties odd and well formed, IPv4/IPv6 hosts, transaction halves, segment boundaries and blank tails,
a corrupt byte) must give the same dispatch requests, consume queues and index lookups on a replica fed the log
in random chunks; a deliberately broken walk must be caught."""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import MethodType
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from cometmq.protocol import record_layout
from cometmq.protocol.message import pack_host
from cometmq.protocol.properties import RawProperties, encode_properties
from cometmq.store import commitlog as commitlog_module
from cometmq.store import record_walk
from cometmq.store.commitlog import dispatch_request_from_record
from cometmq.store.dispatch import ReputService
from cometmq.store.message import DispatchRequest, MessageInner
from cometmq.store.message_store import MessageStore
from tests.kit import FakeClock

from .conftest import small_config

needs_c = pytest.mark.skipif(record_walk.C_WALK is None, reason="C helper not built")
Walk = Callable[..., tuple[list[DispatchRequest], int, int]]


def reference_reput_from_log(self: ReputService, until: int, *, notify: bool = True) -> int:
    """The dispatcher's decode before record_walk, kept as the reference (scan, then a full decode per record)."""
    count = 0
    batch: list[DispatchRequest] = []
    table = self.commitlog.queue_table
    for offset, view in self.commitlog.scan(self.reput_offset, until, check_crc=False):
        req = dispatch_request_from_record(offset, view)
        if req is None:
            logging.getLogger("cometmq.store.dispatch").error("undecodable record at %d stops the dispatch", offset)
            break
        for hook in self.tag_code_hooks:
            hook(req)
        if req.goes_to_consume_queue:
            key = (req.topic, req.queue_id)
            if table.get(key, 0) <= req.queue_offset:
                table[key] = req.queue_offset + 1
        batch.append(req)
        if len(batch) >= 1024:
            self._dispatch_all(batch, notify=notify)
            count += len(batch)
            batch = []
    if batch:
        self._dispatch_all(batch, notify=notify)
        count += len(batch)
    if self.reput_offset < until:
        mf = self.commitlog.files.find(self.reput_offset)
        if mf is not None and mf is not self.commitlog.files.last and until >= mf.end_offset:
            self.reput_offset = mf.end_offset
            if self.reput_offset < until:
                count += reference_reput_from_log(self, until, notify=notify)
    return count


@contextmanager
def walking_with(walk: Walk) -> Iterator[None]:
    with mock.patch.object(commitlog_module, "walk_records", walk):
        yield


def _broken_walk(buf: Any, pos: int, end: int, base: int, limit: int) -> tuple[list[DispatchRequest], int, int]:
    """The reference walk reading the store time where a record with IPv4 hosts has it, whatever its hosts."""
    reqs, pos, why = record_walk.walk_records_py(buf, pos, end, base, limit)
    at = record_layout.LAYOUT_V4.store_timestamp_pos
    for req in reqs:
        if req.sys_flag & record_layout.STOREHOST_V6_FLAG:
            req.store_timestamp = int.from_bytes(buf[req.phy_offset - base + at : req.phy_offset - base + at + 8],
                                                 "big", signed=True)
    return reqs, pos, why


WALKS: dict[str, Walk] = {"python": record_walk.walk_records_py}
if record_walk.C_WALK is not None:
    WALKS["c"] = record_walk._walk_c

# -- random logs -----------------------------------------------------------------------------------------------------
TOPICS = ["T", "Topic-A", "主题", "%RETRY%g", "x" * 100]
NAMES = ["TAGS", "KEYS", "UNIQ_KEY", "TAGSX", "XTAGS", "a", "ünï", "TIMER_OUT_MS"]
VALUES = ["", "v", "TagA", "k1 k2  k3", "héllo", "日本", "😀x", "\ud7ff"]
_good_props = st.dictionaries(st.sampled_from(NAMES), st.sampled_from(VALUES), max_size=5).map(encode_properties)
_odd_pair = st.sampled_from([b"noseparator", b"", b"\x01nameless", b"TAGS\x01a\x01b", b"KEYS\x01k9",
                             b"TAGS\x01second", b"\x00\x01zero"])
_odd_props = st.lists(st.one_of(_odd_pair, _good_props), max_size=5).map(lambda ps: b"\x02".join(ps))
#: rarely: not UTF-8 (the dispatch stops there), or a lone surrogate's bytes (not UTF-8 to Python either)
_bad_props = st.sampled_from([b"TAGS\x01\xff\x02", b"KEYS\x01\xed\xa0\x80\x02"])
#: mostly well formed, some odd, one in 30 not UTF-8 (it stops the dispatch: more would leave little to compare)
properties = st.tuples(st.integers(0, 29), _good_props, _odd_props, _bad_props).map(
    lambda t: t[3] if t[0] == 0 else t[2] if t[0] < 8 else t[1])
HOSTS = [pack_host("10.0.0.7", 4001), pack_host("2001:db8::7", 4002)]

message = st.builds(
    lambda topic, qid, props, body, born, halves: MessageInner(
        topic=topic, body=body, queue_id=qid, properties={}, properties_raw=props, born_host=born,
        sys_flag=halves, born_timestamp=1_700_000_000_000),
    st.sampled_from(TOPICS), st.integers(0, 2), properties, st.binary(max_size=300), st.sampled_from(HOSTS),
    st.sampled_from([0, 0, 0, 0x4, 0x8, 0xC]))
log_spec = st.fixed_dictionaries({
    "batches": st.lists(st.lists(message, min_size=1, max_size=12), min_size=1, max_size=14),
    "store_v6": st.booleans(),
    "corrupt": st.one_of(st.none(), st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255))),
    "chunks": st.lists(st.integers(1, 3000), min_size=1, max_size=8),
})


def _build_master(path: Path, spec: dict[str, Any]) -> MessageStore:
    store_host = ("::1", 10911) if spec["store_v6"] else ("127.0.0.1", 10911)
    master = MessageStore(small_config(path, commitlog_segment_size=4096, max_message_size=1024),
                          store_host=store_host, clock=FakeClock(1_700_000_000_000))
    master.start()
    for batch in spec["batches"]:
        master.put_messages(batch)
    if spec["corrupt"] is not None:
        where, value = spec["corrupt"]
        at = int(where * master.commitlog.max_offset)
        mf = master.commitlog.files.find(at)
        assert mf is not None
        mf.mm[at - mf.file_from_offset] = value
    return master


def _replica(path: Path, reference: bool) -> tuple[MessageStore, list[DispatchRequest]]:
    replica = MessageStore(small_config(path, commitlog_segment_size=4096, max_message_size=1024),
                           clock=FakeClock(1_700_000_000_000))
    replica.start()
    if reference:
        replica.reput.reput_from_log = MethodType(reference_reput_from_log, replica.reput)  # type: ignore[method-assign]
    got: list[DispatchRequest] = []
    replica.add_arrival_batch_listener(got.extend)
    return replica, got


def _copy(master: MessageStore, replica: MessageStore, chunks: list[int]) -> None:
    """The master's log in pieces of the given sizes (cycled), as replication ships it."""
    end = master.commitlog.max_offset
    offset, i = 0, 0
    while offset < end:
        mf = master.commitlog.files.find(offset)
        assert mf is not None
        pos = offset - mf.file_from_offset
        n = min(chunks[i % len(chunks)], mf.wrote_position - pos)
        i += 1
        assert replica.append_raw(offset, bytes(mf.view(pos, n)))
        offset += n


def _queues(store: MessageStore) -> dict[tuple[str, int], list[tuple[int, int, int] | None]]:
    return {key: [cq.get_unit(i) for i in range(cq.min_offset, cq.max_offset)] for key, cq in store.queues.items()}


def _lookups(store: MessageStore, spec: dict[str, Any]) -> dict[tuple[str, str], list[bytes]]:
    keys = {(m.topic, k) for batch in spec["batches"] for m in batch for k in ("v", "TagA", "k1", "k3", "héllo")}
    return {key: [bytes(v) for v in store.query_by_key(*key)] for key in sorted(keys)}


def check_walk(walk: Walk, spec: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        master = _build_master(Path(tmp) / "master", spec)
        stores = [master]
        try:
            end = master.commitlog.max_offset
            # The dispatcher over the master's whole log (as recovery re-dispatches it).
            results = []
            for reference in (True, False):
                reput = ReputService(master.commitlog)
                seen: list[DispatchRequest] = []
                reput.dispatchers.append(seen.extend)
                with walking_with(walk):
                    count = (reference_reput_from_log(reput, end) if reference else reput.reput_from_log(end))
                results.append((seen, count, reput.reput_offset))
            assert results[1] == results[0]
            event(f"records dispatched: {len(results[0][0]) // 25 * 25}+, log "
                  f"{'ends' if results[0][2] == end else 'stops early'}")
            # Replicas fed the log in chunks that end mid-record.
            replicas = []
            with walking_with(walk):
                for reference in (True, False):
                    replica, got = _replica(Path(tmp) / f"replica-{reference}", reference)
                    stores.append(replica)
                    _copy(master, replica, spec["chunks"])
                    replicas.append((got, replica.reput.reput_offset, replica.commitlog.queue_table,
                                     _queues(replica), _lookups(replica, spec)))
            assert replicas[1] == replicas[0]
        finally:
            for s in stores:
                s.shutdown()


@pytest.mark.parametrize("name", list(WALKS))
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=log_spec)
def test_walk_gives_the_references_requests(name: str, spec: dict[str, Any]) -> None:
    """20 logs a walk in CI (~0.4 s each); the soak variant below runs 400."""
    check_walk(WALKS[name], spec)


@pytest.mark.soak
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("name", list(WALKS))
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=log_spec)
def test_walk_gives_the_references_requests_long(name: str, spec: dict[str, Any]) -> None:
    check_walk(WALKS[name], spec)


@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")  # the falsifying example's long repr
def test_a_broken_walk_is_caught() -> None:
    @settings(max_examples=200, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=[HealthCheck.too_slow])
    @given(spec=log_spec)
    def run(spec: dict[str, Any]) -> None:
        check_walk(_broken_walk, spec)

    with pytest.raises(AssertionError):
        run()


# -- fixed cases -------------------------------------------------------------------------------------------------------
def _records(path: Path, props: list[bytes], topic: str = "T") -> tuple[MessageStore, bytes, list[int]]:
    master = MessageStore(small_config(path), clock=FakeClock(1_700_000_000_000))
    master.start()
    res = master.put_messages([MessageInner(topic=topic, body=b"b", properties={}, properties_raw=p) for p in props])
    assert res.ok
    data = bytes(master.commitlog.read(0, master.commitlog.max_offset) or b"")
    return master, data, [r.phy_offset for r in res.records]


@pytest.mark.parametrize("name", list(WALKS))
@pytest.mark.parametrize("bad", ["properties", "topic"])
def test_an_undecodable_record_stops_the_dispatch(tmp_path: Path, name: str, bad: str,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    """A record whose properties or topic are not UTF-8 is not dispatched, nor anything after it (the reput offset
    stays before it, and the next confirm tries again); what came before it is."""
    good = b"TAGS\x01a\x02"
    master, data, offsets = _records(tmp_path / "m", [good, good if bad == "topic" else b"TAGS\x01\xff\x02", good])
    master.shutdown()
    if bad == "topic":
        at = offsets[1] + record_layout.LAYOUT_V4.body_pos + 1 + 1  # the topic "T" after its 1-byte body
        assert data[at] == ord("T")
        data = data[:at] + b"\xff" + data[at + 1 :]
    with walking_with(WALKS[name]):
        replica, got = _replica(tmp_path / "r", reference=False)
        try:
            with caplog.at_level(logging.ERROR):
                assert replica.append_raw(0, bytes(data))
            assert [r.phy_offset for r in got] == offsets[:1]
            assert replica.reput.reput_offset == offsets[1]
            assert f"undecodable record at {offsets[1]} stops the dispatch" in caplog.text
            assert replica.queues[("T", 0)].max_offset == 1
        finally:
            replica.shutdown()


@pytest.mark.parametrize("name", list(WALKS))
def test_a_record_cut_short_waits_for_its_tail(tmp_path: Path, name: str) -> None:
    """A replica's log can end inside a record: the part missing reads as zeros, which could pass for short
    properties; it is dispatched only once its last byte is there (the reference dispatched TAGS=T\\0\\0...)."""
    master, data, offsets = _records(tmp_path / "m", [b"TAGS\x01TagTag\x02", b"TAGS\x01TagTag\x02"])
    master.shutdown()
    with walking_with(WALKS[name]):
        replica, got = _replica(tmp_path / "r", reference=False)
        try:
            cut = offsets[1] - 3
            assert replica.append_raw(0, data[:cut])
            assert got == []
            assert replica.append_raw(cut, data[cut:])
            assert [(r.phy_offset, r.properties.get("TAGS")) for r in got] == [(o, "TagTag") for o in offsets]
        finally:
            replica.shutdown()


def test_properties_stay_encoded(tmp_path: Path) -> None:
    """The requests carry RawProperties over the record's bytes: the index builder's C helper reads them as they are,
    and a listener that needs more decodes them on first use (they are UTF-8: that cannot fail)."""
    master, data, _ = _records(tmp_path / "m", [b"TAGS\x01a\x02KEYS\x01k1 k2\x02UNIQ_KEY\x01U\x02"])
    try:
        for walk in WALKS.values():
            reqs, pos, why = walk(data, 0, len(data), 0, 10)
            assert (pos, why) == (len(data), record_walk.SHORT)
            (req,) = reqs
            assert type(req.properties) is RawProperties
            assert req.properties.raw == b"TAGS\x01a\x02KEYS\x01k1 k2\x02UNIQ_KEY\x01U\x02"
            assert (req.keys, req.uniq_key, dict(req.properties)) == ("k1 k2", "U", {"TAGS": "a", "KEYS": "k1 k2",
                                                                                    "UNIQ_KEY": "U"})
    finally:
        master.shutdown()


@pytest.mark.parametrize("name", list(WALKS))
def test_the_limit_and_the_blank_tail(tmp_path: Path, name: str) -> None:
    master, data, offsets = _records(tmp_path / "m", [b"", b"TAGS\x01x\x02", b""])
    master.shutdown()
    walk = WALKS[name]
    reqs, pos, why = walk(data, 0, len(data), 1000, 2)
    assert ([r.phy_offset for r in reqs], pos, why) == ([1000 + o for o in offsets[:2]], offsets[2], record_walk.LIMIT)
    blank = data + (8).to_bytes(4, "big") + record_layout.BLANK_MAGIC_CODE.to_bytes(4, "big")
    reqs, pos, why = walk(blank, offsets[2], len(blank), 0, 10)
    assert (len(reqs), pos, why) == (1, len(data), record_walk.BLANK)


@needs_c
def test_c_layout_constants_are_the_owners() -> None:
    """The C helper keeps its own copies of the record layout and of the walk's outcomes: they must be the owners'."""
    got = record_walk._C_HELPER.layout()
    owner = {name: getattr(record_layout, name) for name in (
        "MAGIC_CODE", "BLANK_MAGIC_CODE", "MAGIC_CODE_POS", "QUEUE_ID_POS", "QUEUE_OFFSET_POS", "SYS_FLAG_POS",
        "BORN_HOST_POS", "HOST_FLAGS_BYTE", "HOST_FLAGS_SHIFT", "IPV4_HOST_SIZE", "IPV6_HOST_SIZE", "MIN_RECORD_SIZE")}
    owner.update({name: getattr(record_walk, name) for name in ("LIMIT", "BLANK", "SHORT", "INVALID", "UNDECODABLE")})
    owner["LAYOUTS"] = [{name: getattr(layout, name) for name in (
        "store_timestamp_pos", "body_length_pos", "body_pos", "min_record_size")} for layout in record_layout.LAYOUTS]
    assert got == owner


def test_the_c_walk_is_built() -> None:
    """Built on this kind of machine; a silent fallback would hide a replica three times slower to dispatch."""
    if os.environ.get("COMETMQ_PURE_PYTHON", "") not in ("", "0"):
        pytest.skip("COMETMQ_PURE_PYTHON is set")
    assert record_walk.C_WALK is not None and record_walk.walk_records is record_walk._walk_c
