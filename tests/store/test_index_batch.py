"""IndexService.put_many writes exactly what one put per key writes, and answers the same queries; the
optional C helper (cometmq.store._indexc) writes exactly what the pure-Python code writes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cometmq.protocol.properties import RawProperties
from cometmq.store import index as index_module
from cometmq.store import index_builder
from cometmq.store.index import IndexService
from cometmq.store.message import DispatchRequest

T0 = 1_700_000_000_000
DAY = 86_400_000

keys = st.sampled_from(["T#a", "T#b", "T#c", "T#é", "T#\ud800", "U#a", "T#" + "x" * 40])
# time steps: mostly forward, sometimes back, sometimes past an int32 of ms (which forces a new file)
steps = st.one_of(st.integers(0, 50), st.integers(-5_000, -1), st.just(30 * DAY))


def contents(index: IndexService) -> list[bytes]:
    return [bytes(f.mm) for f in index.files]


needs_c = pytest.mark.skipif(index_module.C_HELPER is None, reason="C helper not built")


def test_the_c_helper_is_built() -> None:
    """The install compiles it on this kind of machine; a silent fallback would hide a slower broker."""
    if os.environ.get("COMETMQ_PURE_PYTHON", "") not in ("", "0"):
        pytest.skip("COMETMQ_PURE_PYTHON is set")
    assert index_module.C_HELPER is not None


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(keys, steps), min_size=1, max_size=120), st.lists(st.integers(1, 40), min_size=1),
       st.booleans())
def test_put_many_equals_put_one_by_one(tmp_path_factory: object, ops: list[tuple[str, int]],
                                        chunks: list[int], c_for_batches: bool) -> None:
    """One put per key in pure Python against batches (through the C helper when built): same bytes."""
    base = Path(tmp_path_factory.mktemp("idx"))  # type: ignore[attr-defined]
    entries = []
    ts = T0
    for phy, (key, step) in enumerate(ops, start=1):
        ts += step
        entries.append((key, phy * 100, ts))
    one = IndexService(base / "one", 8, 16)  # tiny files: several rolls
    many = IndexService(base / "many", 8, 16)
    one.load()
    many.load()
    helper = index_module.C_HELPER
    try:
        index_module.C_HELPER = None
        for e in entries:
            assert one.put(*e)
        index_module.C_HELPER = helper if c_for_batches else None
        i = c = 0
        while i < len(entries):
            size = chunks[c % len(chunks)]
            c += 1
            assert many.put_many(entries[i:i + size]) == len(entries[i:i + size])
            i += size
        assert len(one.files) == len(many.files)
        assert contents(one) == contents(many)
        assert one.max_phy_offset == many.max_phy_offset
        for key in {k for k, _, _ in entries}:
            assert one.query(key, 1000, 0, 2**62) == many.query(key, 1000, 0, 2**62)
    finally:
        index_module.C_HELPER = helper
        one.close()
        many.close()


@needs_c
def test_c_helper_continues_past_a_torn_slot_head(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A slot head pointing past the count (a crash between entry and header) makes the C loop hand that
    entry to Python, which walks the chain back; both paths end with the same bytes."""
    files = []
    for name, helper in (("py", None), ("c", index_module.C_HELPER)):
        monkeypatch.setattr(index_module, "C_HELPER", helper)
        index = IndexService(tmp_path / name, 4, 64)
        index.load()
        assert index.put_many([(f"T#k{i}", 100 + i, T0 + i) for i in range(10)]) == 10
        f = index.files[-1]
        f.mm[64:64 + 16] = (50).to_bytes(4, "big") * 4  # every slot head now past the count
        assert index.put_many([(f"T#k{i}", 200 + i, T0 + 20 + i) for i in range(10)]) == 10
        files.append(bytes(f.mm))
        assert index.query("T#k3", 10, 0, 2**62) == [203]  # the chain back to 103 was cut by the damage
        index.close()
    assert files[0] == files[1]


names = st.sampled_from(["UNIQ_KEY", "KEYS", "TAGS", "XKEYS", "UNIQ_KE", "a"])
values = st.text(st.sampled_from("ab é#"), max_size=8)


@needs_c
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["T", "Tö", "%RETRY%g"]), st.lists(st.tuples(names, values), max_size=6),
                          st.booleans()), max_size=12),
       st.integers(-1, 8))
def test_c_collect_matches_python(reqs: list[tuple[str, list[tuple[str, str]], bool]], floor: int) -> None:
    """Same (hash, offset, time) entries as the Python loop for raw and decoded properties alike: repeated
    names (the last wins), names that merely contain UNIQ_KEY or KEYS, empty values, several spaces."""
    batch = []
    for phy, (topic, pairs, raw) in enumerate(reqs):
        encoded = b"".join(n.encode() + b"\x01" + v.encode() + b"\x02" for n, v in pairs)
        props = RawProperties(encoded) if raw else dict(pairs)
        batch.append(DispatchRequest(topic, 0, phy, 10, 0, T0 + phy, phy, 0, props))
    helper = index_module.C_HELPER
    try:
        index_builder.C_HELPER = None
        expected = index_builder.hashed_entries(batch, floor)
    finally:
        index_builder.C_HELPER = helper
    assert helper.collect(batch, floor, RawProperties) == expected
    assert index_builder.hashed_entries(batch, floor) == expected


@needs_c
def test_c_put_run_refuses_a_wrong_geometry(tmp_path: Path) -> None:
    index = IndexService(tmp_path / "index", 8, 16)
    index.load()
    assert index.put("T#a", 100, T0)
    f = index.files[-1]
    before = bytes(f.mm)
    with pytest.raises(ValueError, match="geometry"):
        index_module.C_HELPER.put_run(f.mm, [(1, 2, T0)], 0, 1, 1, T0, 100, 100, 8, 10_000, f.entry_base, T0, T0)
    with pytest.raises(TypeError, match="tuples"):
        index_module.C_HELPER.put_run(f.mm, [(1, 2)], 0, 1, 1, T0, 100, 100, 8, 16, f.entry_base, T0, T0)
    assert bytes(f.mm) == before
    index.close()


def test_put_many_survives_a_restart(tmp_path: Path) -> None:
    index = IndexService(tmp_path / "index", 64, 256)
    index.load()
    assert index.put_many([(f"T#k{i % 10}", 100 + i, T0 + i) for i in range(300)]) == 300
    assert len(index.files) == 2
    index.close()
    again = IndexService(tmp_path / "index", 64, 256)
    again.load()
    try:
        assert again.max_phy_offset == 399
        assert again.query("T#k3", 1000, 0, 2**62) == [100 + i for i in range(299, -1, -1) if i % 10 == 3]
    finally:
        again.close()


@pytest.mark.parametrize("chunk", [1, 3, 4096])
def test_a_drain_of_many_batches_writes_what_one_drain_per_batch_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                        chunk: int) -> None:
    """The builder applies the batches queued together (up to DRAIN_CHUNK_RECORDS records at a time): the same
    index bytes as a drain after every batch, every key found, and the applied offset at the last record's end."""
    monkeypatch.setattr(index_builder, "DRAIN_CHUNK_RECORDS", chunk)
    batches = []
    phy = 100
    for b in range(40):
        batch = []
        for r in range(1 + b % 3):
            raw = f"UNIQ_KEY\x01U{b}-{r}\x02KEYS\x01k{b} k{r}\x02".encode()
            batch.append(DispatchRequest("T", 0, phy, 50, 0, T0 + b, 0, 0, RawProperties(raw)))
            phy += 50
        batches.append(batch)
    one = IndexService(tmp_path / "one", 8, 64)  # small files: the drains roll several
    together = IndexService(tmp_path / "together", 8, 64)
    one.load()
    together.load()
    each, queued = index_builder.IndexBuilder(one), index_builder.IndexBuilder(together)
    queued._running = True  # (a started builder only queues what it is handed; nothing runs its thread here)
    try:
        for batch in batches:
            each.submit(batch)  # not started: applied at once
            queued.submit(batch)
        assert not queued.caught_up()
        queued.drain()
        assert queued.caught_up() and queued.applied_offset == phy == each.applied_offset
        assert contents(one) == contents(together)
        for b in range(40):
            assert together.query(f"T#U{b}-0", 10, 0, 2**62) == [100 + 50 * sum(1 + i % 3 for i in range(b))]
    finally:
        one.close()
        together.close()
