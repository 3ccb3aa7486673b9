"""IndexService.put_many writes exactly what one put per key writes, and answers the same queries."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from cometmq.store.index import IndexService

T0 = 1_700_000_000_000
DAY = 86_400_000

keys = st.sampled_from(["T#a", "T#b", "T#c", "T#é", "T#\ud800", "U#a", "T#" + "x" * 40])
# time steps: mostly forward, sometimes back, sometimes past an int32 of ms (which forces a new file)
steps = st.one_of(st.integers(0, 50), st.integers(-5_000, -1), st.just(30 * DAY))


def contents(index: IndexService) -> list[bytes]:
    return [bytes(f.mm) for f in index.files]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(keys, steps), min_size=1, max_size=120), st.lists(st.integers(1, 40), min_size=1))
def test_put_many_equals_put_one_by_one(tmp_path_factory: object, ops: list[tuple[str, int]],
                                        chunks: list[int]) -> None:
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
    try:
        for e in entries:
            assert one.put(*e)
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
        one.close()
        many.close()


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
