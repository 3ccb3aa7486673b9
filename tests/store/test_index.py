"""The key index: chains, collisions, roll-over, time ranges, restart, truncation, retention, damage."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cometmq.store.index import ENTRY_SIZE, HEADER_SIZE, SLOT_SIZE, IndexService, key_hash

T0 = 1_700_000_000_000


def service(path: Path, slots: int = 64, entries: int = 256) -> IndexService:
    index = IndexService(path / "index", slots, entries)
    index.load()
    return index


def index_files(path: Path) -> list[str]:
    return sorted(p.name for p in (path / "index").iterdir())


def test_stable_hash() -> None:
    assert key_hash("TopicTest#k1") == zlib.crc32(b"TopicTest#k1")
    assert key_hash("T#\udc80") == zlib.crc32("T#\udc80".encode("utf-8", "surrogatepass"))


def test_empty_index(tmp_path: Path) -> None:
    index = service(tmp_path)
    assert index.max_phy_offset == -1
    assert index.query("T#k", 10, 0, 2**62) == []
    assert index_files(tmp_path) == []  # no file until the first put
    index.close()


def test_put_query_newest_first_and_deduplicated(tmp_path: Path) -> None:
    index = service(tmp_path)
    assert index.put("T#a", 100, T0)
    assert index.put("T#b", 100, T0)
    assert index.put("T#a", 300, T0 + 5)
    assert index.put("T#a", 300, T0 + 5)  # a re-dispatched record indexed twice
    assert index.query("T#a", 10, 0, 2**62) == [300, 100]
    assert index.query("T#a", 1, 0, 2**62) == [300]
    assert index.query("T#a", 0, 0, 2**62) == []
    assert index.query("T#b", 10, 0, 2**62) == [100]
    assert index.query("T#c", 10, 0, 2**62) == []
    assert index.max_phy_offset == 300
    index.close()


def test_many_keys_sharing_few_slots(tmp_path: Path) -> None:
    index = service(tmp_path, slots=8, entries=4096)
    expected: dict[str, list[int]] = {}
    for i in range(3000):
        key = f"T#k{i % 300}"
        assert index.put(key, i * 10, T0 + i)
        expected.setdefault(key, []).insert(0, i * 10)
    assert len(index.files) == 1
    for key, offsets in expected.items():
        assert index.query(key, 100, 0, 2**62) == offsets
    index.close()


def test_equal_hashes_give_false_positives_the_caller_filters(tmp_path: Path) -> None:
    assert key_hash("plumless") == key_hash("buckeroo")
    index = service(tmp_path)
    index.put("plumless", 10, T0)
    index.put("buckeroo", 20, T0)
    index.put("other", 30, T0)
    assert index.query("plumless", 10, 0, 2**62) == [20, 10]
    index.close()


def test_chain_across_rollover(tmp_path: Path) -> None:
    index = service(tmp_path, slots=4, entries=16)
    for i in range(100):
        assert index.put("T#hot" if i % 2 == 0 else f"T#cold{i}", i * 100, T0 + i * 1000)
    assert len(index.files) == 7  # 100 entries at 16 a file
    assert index_files(tmp_path) == sorted(index_files(tmp_path), key=int)
    assert len(set(index_files(tmp_path))) == 7
    hot = [i * 100 for i in range(98, -1, -2)]
    assert index.query("T#hot", 1000, 0, 2**62) == hot
    assert index.query("T#hot", 5, 0, 2**62) == hot[:5]
    assert index.query("T#cold51", 10, 0, 2**62) == [5100]
    index.close()


def test_time_range_filter(tmp_path: Path) -> None:
    index = service(tmp_path, slots=4, entries=8)
    for i in range(40):
        index.put("T#k", i, T0 + i * 60_000)
    assert index.query("T#k", 100, T0 + 10 * 60_000, T0 + 12 * 60_000) == [12, 11, 10]  # bounds inclusive
    assert index.query("T#k", 100, T0 + 10 * 60_000 + 1, T0 + 12 * 60_000 - 1) == [11]
    assert index.query("T#k", 100, 0, T0 - 1) == []
    assert index.query("T#k", 100, T0 + 40 * 60_000, 2**62) == []
    assert index.query("T#k", 100, 0, 2**62) == list(range(39, -1, -1))
    index.close()


def test_clock_steps_back_and_far_apart_times(tmp_path: Path) -> None:
    index = service(tmp_path)
    index.put("T#k", 1, T0)
    index.put("T#k", 2, T0 - 5_000)  # the clock stepped back
    index.put("T#k", 3, T0 + 40 * 86_400_000)  # beyond an int32 of ms from the anchor: a new file
    assert len(index.files) == 2
    assert index.query("T#k", 10, T0 - 5_000, T0 - 5_000) == [2]
    assert index.query("T#k", 10, T0 + 1, 2**62) == [3]
    assert index.query("T#k", 10, 0, 2**62) == [3, 2, 1]
    index.close()


def test_restart_keeps_answers_and_max_phy_offset(tmp_path: Path) -> None:
    index = service(tmp_path, slots=16, entries=32)
    for i in range(50):
        index.put(f"T#k{i % 7}", 1000 + i * 10, T0 + i)
    before = {f"T#k{k}": index.query(f"T#k{k}", 100, 0, 2**62) for k in range(7)}
    index.flush()
    index.close()
    index = service(tmp_path, slots=16, entries=32)
    assert index.max_phy_offset == 1490
    assert {k: index.query(k, 100, 0, 2**62) for k in before} == before
    # the last file goes on taking puts
    index.put("T#k0", 2000, T0 + 100)
    assert len(index.files) == 2
    assert index.query("T#k0", 2, 0, 2**62) == [2000, 1490]
    index.close()


def test_files_keep_their_own_geometry(tmp_path: Path) -> None:
    index = service(tmp_path, slots=16, entries=32)
    index.put("T#k", 1, T0)
    index.close()
    index = service(tmp_path, slots=64, entries=8)  # the configuration changed between runs
    index.put("T#k", 2, T0 + 1)
    assert len(index.files) == 1  # the old file is not full yet
    assert index.query("T#k", 10, 0, 2**62) == [2, 1]
    index.close()


def test_truncate_after(tmp_path: Path) -> None:
    index = service(tmp_path, slots=8, entries=16)
    for i in range(40):
        index.put(f"T#k{i % 3}", i * 100, T0 + i)
    assert len(index.files) == 3  # phy 0..1500, 1600..3100, 3200..3900
    index.truncate_after(2050)
    assert len(index.files) == 2
    assert index.max_phy_offset == 2000
    assert index.query("T#k0", 100, 0, 2**62) == [i * 100 for i in range(20, -1, -1) if i % 3 == 0]
    # re-dispatch fills the same offsets again without stale or doubled answers
    for i in range(21, 40):
        index.put(f"T#k{i % 3}", i * 100, T0 + i)
    assert index.query("T#k1", 100, 0, 2**62) == [i * 100 for i in range(39, -1, -1) if i % 3 == 1]
    index.flush()
    index.close()
    index = service(tmp_path, slots=8, entries=16)
    assert index.max_phy_offset == 3900
    assert index.query("T#k2", 100, 0, 2**62) == [i * 100 for i in range(39, -1, -1) if i % 3 == 2]
    index.truncate_after(0)
    assert index.max_phy_offset == -1
    assert index.query("T#k2", 100, 0, 2**62) == []
    assert index.put("T#k2", 0, T0)
    assert index.query("T#k2", 100, 0, 2**62) == [0]
    index.close()


def test_truncate_past_the_end_changes_nothing(tmp_path: Path) -> None:
    index = service(tmp_path)
    index.put("T#a", 10, T0)
    index.truncate_after(11)
    assert index.max_phy_offset == 10
    assert index.query("T#a", 10, 0, 2**62) == [10]
    index.close()


def test_delete_files_before(tmp_path: Path) -> None:
    index = service(tmp_path, slots=8, entries=10)
    for i in range(35):
        index.put("T#k", i * 10, T0 + i)
    assert len(index.files) == 4  # ends 90, 190, 290, 340
    assert index.delete_files_before(190) == 1
    assert index.delete_files_before(191) == 1
    assert index.delete_files_before(10**9) == 1  # never the last, writable file
    assert len(index.files) == 1 and len(index_files(tmp_path)) == 1
    assert index.query("T#k", 100, 0, 2**62) == list(range(340, 290, -10))
    assert index.max_phy_offset == 340
    index.close()


@pytest.mark.parametrize("damage", ["garbage", "short", "empty", "long", "count", "offsets"])
def test_damaged_file_is_moved_aside(tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    index = service(tmp_path, slots=8, entries=4)
    for i in range(10):
        index.put("T#k", i, T0 + i)
    index.close()
    names = index_files(tmp_path)
    victim = tmp_path / "index" / names[1]
    data = bytearray(victim.read_bytes())
    if damage == "garbage":
        data[:HEADER_SIZE] = os.urandom(HEADER_SIZE)
    elif damage == "short":
        data = data[: len(data) // 2]
    elif damage == "empty":
        data = bytearray()
    elif damage == "long":
        data += bytes(100)
    elif damage == "count":
        data[40:44] = (1000).to_bytes(4, "big")  # an entry count past the file's capacity
    else:
        data[56:64] = (-5).to_bytes(8, "big", signed=True)  # end offset below the begin offset
    victim.write_bytes(bytes(data))
    index = service(tmp_path, slots=8, entries=4)
    assert "moving it aside" in caplog.text
    assert (tmp_path / "index" / f"{names[1]}.corrupt").exists()
    assert len(index.files) == 2
    assert index.query("T#k", 100, 0, 2**62) == [9, 8, 3, 2, 1, 0]
    assert index.put("T#k", 10, T0 + 10)
    index.close()


def test_put_cut_short_by_a_crash(tmp_path: Path) -> None:
    index = service(tmp_path, slots=8, entries=16)
    index.put("T#a", 10, T0)
    index.put("T#b", 20, T0)
    f = index.files[-1]
    # A put that wrote its entry and slot head but died before the count: a torn write after power loss.
    slot = HEADER_SIZE + (key_hash("T#a") % 8) * SLOT_SIZE
    entry = HEADER_SIZE + 8 * SLOT_SIZE + 2 * ENTRY_SIZE
    f.mm[entry : entry + ENTRY_SIZE] = (key_hash("T#a").to_bytes(4, "big") + (30).to_bytes(8, "big")
                                        + (0).to_bytes(4, "big") + (1).to_bytes(4, "big", signed=True))
    f.mm[slot : slot + SLOT_SIZE] = (3).to_bytes(4, "big")
    index.close()
    index = service(tmp_path, slots=8, entries=16)
    assert index.max_phy_offset == 20
    assert index.query("T#a", 10, 0, 2**62) == [10]
    # The next put reuses entry 3 for another slot; T#a's slot must no longer lead there.
    assert key_hash("T#c") % 8 != key_hash("T#a") % 8
    index.put("T#c", 30, T0 + 1)
    index.put("T#a", 40, T0 + 1)
    assert index.query("T#a", 10, 0, 2**62) == [40, 10]
    assert index.query("T#c", 10, 0, 2**62) == [30]
    index.close()


def test_slot_pointing_past_the_count_is_ignored(tmp_path: Path) -> None:
    index = service(tmp_path, slots=8, entries=16)
    index.put("T#a", 10, T0)
    f = index.files[-1]
    slot = HEADER_SIZE + (key_hash("T#a") % 8) * SLOT_SIZE
    f.mm[slot : slot + SLOT_SIZE] = (9).to_bytes(4, "big")  # torn: the slot page reached disk, not the entry
    assert index.query("T#a", 10, 0, 2**62) == []
    assert index.put("T#a", 20, T0)
    assert index.query("T#a", 10, 0, 2**62) == [20]
    index.close()


def test_put_fails_softly_when_no_file_can_be_made(tmp_path: Path) -> None:
    (tmp_path / "blocker").write_bytes(b"")
    index = IndexService(tmp_path / "blocker" / "index", 8, 8)
    assert index.put("T#k", 1, T0) is False
    assert index.query("T#k", 10, 0, 2**62) == []


_ops = st.lists(st.one_of(
    st.tuples(st.just("put"), st.integers(0, 5), st.integers(1, 3), st.integers(0, 50)),
    st.tuples(st.just("truncate"), st.integers(0, 40), st.just(0), st.just(0)),
    st.tuples(st.just("delete"), st.integers(0, 40), st.just(0), st.just(0)),
    st.tuples(st.just("restart"), st.just(0), st.just(0), st.just(0)),
), max_size=60)


@settings(max_examples=60, deadline=None)
@given(ops=_ops)
def test_matches_a_simple_model(tmp_path_factory: pytest.TempPathFactory,
                                ops: list[tuple[str, int, int, int]]) -> None:
    path = tmp_path_factory.mktemp("model")
    index = service(path, slots=4, entries=5)
    model: list[tuple[str, int, int]] = []  # (key, phy, ts), oldest first
    phy = 0
    for op, a, b, c in ops:
        if op == "put":
            phy += b
            assert index.put(f"T#k{a}", phy, T0 + c)
            model.append((f"T#k{a}", phy, T0 + c))
        elif op == "truncate":
            index.truncate_after(a)
            model = [m for m in model if m[1] < a]
            phy = min(phy, max(a - 1, 0))
            assert index.max_phy_offset <= a
        elif op == "delete":
            index.delete_files_before(a)  # may drop old answers; the model keeps what remains possible
            kept = {p for f in index.files for p in range(f.begin_phy, f.end_phy + 1)}
            model = [m for m in model if m[1] in kept]
        else:
            index.flush()
            index.close()
            index = service(path, slots=4, entries=5)
        for k in range(6):
            want: list[int] = []
            for key, p, _ in reversed(model):
                if key == f"T#k{k}" and p not in want:
                    want.append(p)
            assert index.query(f"T#k{k}", 1000, 0, 2**62) == want
            in_range = [p for key, p, ts in reversed(model) if key == f"T#k{k}" and T0 + 10 <= ts <= T0 + 20]
            assert index.query(f"T#k{k}", 1000, T0 + 10, T0 + 20) == list(dict.fromkeys(in_range))
    index.close()
