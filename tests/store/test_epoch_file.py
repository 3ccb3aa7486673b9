"""The epoch file: RocketMQ's epochFileCheckpoint format, durable rewrites with a .bak, the append (replacement and
fencing) and truncation rules, and the consistent point of the HA handshake, checked against a model of a
replicated log."""

from __future__ import annotations

import os
import zlib
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, settings, target
from hypothesis import strategies as st

from cometmq.common import atomic_file
from cometmq.store import epoch_file
from cometmq.store.epoch_file import (
    EpochEntry,
    EpochFencedError,
    EpochFile,
    EpochFileCorrupt,
    EpochRange,
    appended,
    consistent_point,
    decode,
    encode,
    truncated_prefix,
    truncated_suffix,
)

E = EpochEntry


def make(tmp_path: Path, *entries: tuple[int, int]) -> EpochFile:
    f = EpochFile(tmp_path / "epochFileCheckpoint")
    for epoch, start in entries:
        f.append(epoch, start)
    return f


# -- the format ---------------------------------------------------------------------------------------------------
def test_format_is_rocketmqs_checkpoint_file() -> None:
    # The example in CheckpointFile.java's Javadoc, CRC included.
    assert encode([E(7, 7000), E(8, 8000)]) == b"2\n773307083\n7-7000\n8-8000\n"
    assert decode(b"2\n773307083\n7-7000\n8-8000\n") == [E(7, 7000), E(8, 8000)]


def test_decode_reads_what_java_reads() -> None:
    lines = b"1-0\r\n2-100"  # CRLF and no final newline: Java's readLine normalises both
    crc = zlib.crc32(b"1-0\n2-100\n") & 0x7FFFFFFF
    assert decode(b"2\r\n%d\r\n" % crc + lines) == [E(1, 0), E(2, 100)]
    assert decode(b"1\n0\n5-9\n") == [E(5, 9)]  # CRC 0: "not checked" (CheckpointFile.NOT_CHECK_CRC_MAGIC_CODE)


@pytest.mark.parametrize("data", [
    b"",
    b"1\n",
    b"x\n0\n1-0\n",
    b"2\n0\n1-0\n",  # count does not match
    b"1\n12345\n1-0\n",  # CRC mismatch
    b"1\n0\n1_0\n",
    b"1\n0\n-1-0\n",
    b"1\n0\n0-5\n",  # epochs start at 1
    b"2\n0\n2-0\n1-5\n",  # out of order
    b"2\n0\n1-5\n2-5\n",  # same start twice
    b"1\n0\n99999999999-0\n",  # epoch above an int
    b"1\n0\n1-0\n\xff",
])
def test_decode_refuses_bad_content(data: bytes) -> None:
    with pytest.raises(ValueError):
        decode(data)


@given(st.lists(st.tuples(st.integers(1, 100), st.integers(0, 1 << 40)), max_size=8))
def test_encode_decode_roundtrip(pairs: list[tuple[int, int]]) -> None:
    epochs = sorted({p[0] for p in pairs})
    starts = sorted({p[1] for p in pairs})
    entries = [E(e, s) for e, s in zip(epochs, starts, strict=False)]
    assert decode(encode(entries)) == entries


@given(st.binary(max_size=64))
def test_decode_garbage_raises_value_error_only(data: bytes) -> None:
    try:
        decode(data)
    except ValueError:
        pass


# -- the file on disk ---------------------------------------------------------------------------------------------
def test_roundtrip_through_the_file(tmp_path: Path) -> None:
    f = make(tmp_path, (1, 0), (2, 100), (5, 300))
    again = EpochFile(tmp_path / "epochFileCheckpoint")
    assert again.entries == (E(1, 0), E(2, 100), E(5, 300))
    assert again.last_epoch() == 5
    assert (tmp_path / "epochFileCheckpoint").read_bytes() == encode(f.entries)
    # the .bak holds the content before the last change
    assert decode((tmp_path / "epochFileCheckpoint.bak").read_bytes()) == [E(1, 0), E(2, 100)]


def test_missing_files_mean_no_epochs(tmp_path: Path) -> None:
    f = EpochFile(tmp_path / "sub" / "epochFileCheckpoint")
    assert f.entries == ()
    assert f.last_epoch() == 0
    assert f.last_entry() is None
    f.append(3, 0)  # creates the folder
    assert EpochFile(tmp_path / "sub" / "epochFileCheckpoint").entries == (E(3, 0),)


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete", "empty"])
def test_damaged_main_falls_back_to_bak(tmp_path: Path, damage: str) -> None:
    make(tmp_path, (1, 0), (2, 100), (3, 200))
    main = tmp_path / "epochFileCheckpoint"
    data = bytearray(main.read_bytes())
    if damage == "flip":
        data[-3] ^= 0x01  # "3-200" -> "3-210": digits stay digits, the CRC catches it
        main.write_bytes(bytes(data))
    elif damage == "truncate":
        main.write_bytes(bytes(data[:-4]))
    elif damage == "delete":
        main.unlink()
    else:
        main.write_bytes(b"")
    f = EpochFile(main)
    assert f.entries == (E(1, 0), E(2, 100))  # the previous content
    # the next write repairs the main file and keeps the good content as .bak
    f.append(4, 300)
    assert EpochFile(main).entries == (E(1, 0), E(2, 100), E(4, 300))
    assert decode((tmp_path / "epochFileCheckpoint.bak").read_bytes()) == [E(1, 0), E(2, 100)]


def test_both_bad_is_a_clear_error(tmp_path: Path) -> None:
    make(tmp_path, (1, 0), (2, 100))
    (tmp_path / "epochFileCheckpoint").write_bytes(b"2\n1\n1-0\n2-100\n")
    (tmp_path / "epochFileCheckpoint.bak").write_bytes(b"garbage")
    with pytest.raises(EpochFileCorrupt, match=r"epochFileCheckpoint: CRC mismatch.*\.bak: "):
        EpochFile(tmp_path / "epochFileCheckpoint")


def test_bad_main_and_no_bak_is_an_error_too(tmp_path: Path) -> None:
    (tmp_path / "epochFileCheckpoint").write_bytes(b"1\n1\n1-0\n")
    with pytest.raises(EpochFileCorrupt, match="missing"):
        EpochFile(tmp_path / "epochFileCheckpoint")


def test_crash_before_the_rename_keeps_the_old_content(tmp_path: Path) -> None:
    make(tmp_path, (1, 0), (2, 100))
    # a crash after the temp file was written, before it replaced the main file
    (tmp_path / "epochFileCheckpoint.tmp").write_bytes(encode([E(1, 0), E(2, 100), E(3, 200)]))
    (tmp_path / "epochFileCheckpoint.bak.tmp").write_bytes(b"half a fi")
    f = EpochFile(tmp_path / "epochFileCheckpoint")
    assert f.entries == (E(1, 0), E(2, 100))
    f.append(3, 200)  # the stale temp files are simply overwritten
    assert EpochFile(tmp_path / "epochFileCheckpoint").entries == (E(1, 0), E(2, 100), E(3, 200))


def test_crash_between_bak_and_main_keeps_the_old_content(tmp_path: Path) -> None:
    f = make(tmp_path, (1, 0), (2, 100))
    real_write = atomic_file.write_atomic
    calls: list[Path] = []

    def crash_on_main(path: str | os.PathLike[str], data: bytes) -> None:
        calls.append(Path(path))
        if Path(path) == f.path:
            raise OSError("simulated crash")
        real_write(path, data)

    with mock.patch.object(epoch_file, "write_atomic", crash_on_main), pytest.raises(OSError):
        f.append(3, 200)
    assert calls == [f.bak_path, f.path]  # .bak first
    assert EpochFile(f.path).entries == (E(1, 0), E(2, 100))


def test_writes_are_durable(tmp_path: Path) -> None:
    synced: list[int] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    f = make(tmp_path, (1, 0))
    with mock.patch("os.fsync", spy):
        f.append(2, 10)
    assert len(synced) == 4  # .bak and main: the file and its folder each


def test_emptied_file_removes_both_copies(tmp_path: Path) -> None:
    f = make(tmp_path, (1, 0), (2, 100))
    assert f.truncate_suffix(0)
    assert f.entries == ()
    assert not f.path.exists() and not f.bak_path.exists()  # no stale .bak to fall back to
    assert EpochFile(f.path).entries == ()
    f.append(7, 0)
    assert EpochFile(f.path).entries == (E(7, 0),)


# -- reading --------------------------------------------------------------------------------------------------------
def test_ranges_find_epoch_and_entry(tmp_path: Path) -> None:
    f = make(tmp_path, (1, 100), (2, 300), (3, 500))
    assert f.ranges() == [EpochRange(1, 100, 300), EpochRange(2, 300, 500), EpochRange(3, 500, None)]
    assert f.ranges(700)[-1] == EpochRange(3, 500, 700)
    assert f.entry(2) == EpochRange(2, 300, 500)
    assert f.entry(3, max_offset=650) == EpochRange(3, 500, 650)
    assert f.entry(4) is None
    assert f.find_epoch(350) == EpochRange(2, 300, 500)
    assert f.find_epoch(300) == EpochRange(2, 300, 500)
    assert f.find_epoch(499) == EpochRange(2, 300, 500)
    assert f.find_epoch(99) is None
    assert f.find_epoch(10**12) == EpochRange(3, 500, None)  # the last one is open
    assert f.find_epoch(700, max_offset=700) is None
    assert f.find_epoch(699, max_offset=700) == EpochRange(3, 500, 700)
    assert len(f) == 3


# -- appending ----------------------------------------------------------------------------------------------------
def test_append_replaces_entries_at_or_after_its_start(tmp_path: Path) -> None:
    f = make(tmp_path, (1, 0), (2, 100), (3, 200))
    assert f.append(5, 150)
    assert f.entries == (E(1, 0), E(2, 100), E(5, 150))
    assert f.append(6, 100)  # equal start: replaced
    assert list(f.entries) == [E(1, 0), E(6, 100)]


def test_new_epoch_at_the_same_offset_replaces_the_last(tmp_path: Path) -> None:
    # RocketMQ #9689: a new epoch under the same master before any write; Java refuses the entry.
    f = make(tmp_path, (1, 0), (2, 100))
    assert f.append(3, 100)
    assert f.entries == (E(1, 0), E(3, 100))
    assert f.find_epoch(100) == EpochRange(3, 100, None)


def test_same_epoch_again(tmp_path: Path) -> None:
    f = make(tmp_path, (1, 0), (2, 100))
    assert not f.append(2, 100)
    assert not f.append(2, 250)  # already covered by epoch 2
    assert f.entries == (E(1, 0), E(2, 100))
    assert f.append(2, 50)  # earlier: the start moves back, and replaces what starts after it
    assert f.entries == (E(1, 0), E(2, 50))


def test_older_epoch_is_fenced(tmp_path: Path) -> None:
    f = make(tmp_path, (3, 0), (5, 100))
    with pytest.raises(EpochFencedError, match="older than the last epoch 5"):
        f.append(4, 200)
    assert f.entries == (E(3, 0), E(5, 100))
    assert EpochFile(f.path).entries == (E(3, 0), E(5, 100))


@pytest.mark.parametrize(("epoch", "start"), [(0, 0), (-1, 0), (1 << 31, 0), (1, -1), (1, 1 << 63)])
def test_append_refuses_out_of_range(tmp_path: Path, epoch: int, start: int) -> None:
    with pytest.raises(ValueError, match="out of range"):
        make(tmp_path).append(epoch, start)


# -- truncation -----------------------------------------------------------------------------------------------------
def test_truncate_suffix(tmp_path: Path) -> None:
    f = make(tmp_path, (1, 100), (2, 300), (3, 500))
    assert f.truncate_suffix(150)  # as EpochFileCacheTest.testTruncate
    assert f.entries == (E(1, 100),)
    assert not f.truncate_suffix(150)
    f = make(tmp_path, (1, 100), (2, 300), (3, 500))
    f.reset([(1, 100), (2, 300), (3, 500)])
    assert f.truncate_suffix(300)  # an entry starting at the offset goes
    assert EpochFile(f.path).entries == (E(1, 100),)


def test_truncate_prefix(tmp_path: Path) -> None:
    f = make(tmp_path, (1, 100), (2, 300), (3, 500))
    assert not f.truncate_prefix(299)
    assert f.truncate_prefix(300)  # epoch 1 ends at 300
    assert f.entries == (E(2, 300), E(3, 500))
    assert f.truncate_prefix(10**9)  # the last one always stays, its start unchanged
    assert EpochFile(f.path).entries == (E(3, 500),)
    assert not make(tmp_path / "empty").truncate_prefix(5)


def test_reset_checks_order(tmp_path: Path) -> None:
    f = make(tmp_path)
    with pytest.raises(ValueError, match="out of order"):
        f.reset([(2, 0), (1, 10)])


# -- the consistent point ---------------------------------------------------------------------------------------------
def test_consistent_point_java_samples() -> None:
    # EpochFileCacheTest.testFindConsistentPointSample1..4, with the log ends made explicit.
    local = [(1, 100), (2, 300), (3, 500)]
    assert consistent_point(local, 700, [(1, 100), (2, 300), (3, 450)], 600) == 450
    assert consistent_point(local, 700, [(1, 100), (2, 300), (3, 500)], 600) == 600
    assert consistent_point(local, 700, [(1, 200), (2, 500)], 800) is None
    assert consistent_point([(1, 100), (2, 300), (3, 500), (4, 800)], 900, local, 700) == 700


def test_consistent_point_common_prefix() -> None:
    # same history; the replica is behind: nothing to cut
    assert consistent_point([(1, 0), (2, 100)], 150, [(1, 0), (2, 100), (3, 400)], 500) == 150


def test_consistent_point_empty_log_that_learned_an_unwritten_epoch() -> None:
    # a replica learned epoch 1 at 0 and holds nothing; the master of epoch 1 died before any write, and the new
    # master replaced epoch 1 by its own epoch 2 at the same start: an empty log agrees with it (seen with
    # `cometmq cluster --controllers 1`: the third broker never rejoined the SyncStateSet)
    assert consistent_point([(1, 0)], 0, [(2, 0)], 0) == 0
    assert consistent_point([(1, 0)], 0, [(2, 0)], 500) == 0
    assert consistent_point([(1, 0), (3, 200)], 200, [(1, 0), (4, 200)], 500) == 200  # the earlier epoch decides
    assert consistent_point([(1, 0)], 100, [(2, 0)], 500) is None  # bytes under epoch 1: not the same history


def test_consistent_point_divergent_last_epoch() -> None:
    # the replica was master of epoch 3 and wrote 200..260 that the new master (epoch 4) never got
    assert consistent_point([(1, 0), (2, 100), (3, 200)], 260, [(1, 0), (2, 100), (4, 200)], 300) == 200
    # ... the new master had copied part of epoch 3 before it was elected
    assert consistent_point([(1, 0), (3, 200)], 260, [(1, 0), (3, 200), (4, 230)], 300) == 230


def test_consistent_point_no_common_entry() -> None:
    assert consistent_point([(2, 0)], 50, [(1, 0), (3, 40)], 90) is None
    assert consistent_point([(1, 0)], 50, [], 0) is None


def test_consistent_point_empty_local_means_no_truncation() -> None:
    # AutoSwitchHAClient.doTruncate: an empty epoch cache skips the truncation and reports the log end
    assert consistent_point([], 0, [(1, 0), (2, 100)], 300) == 0
    assert consistent_point([], 120, [(1, 0)], 300) == 120


def test_consistent_point_never_past_the_local_log_end() -> None:
    # the log ends before the last entry's start (Java's endless last end would give the master's end)
    assert consistent_point([(1, 0), (2, 100)], 80, [(1, 0), (2, 100)], 300) == 80


def test_find_consistent_point_method(tmp_path: Path) -> None:
    f = make(tmp_path, (1, 0), (2, 100))
    assert f.find_consistent_point([(1, 0), (3, 50)], 180, 400) == 50


# -- a model: two replicas, failovers, copying, truncation ------------------------------------------------------------
Label = tuple[int, int]  # (epoch that wrote the unit, unit number): one log "byte"


def _lcp(a: list[Label], b: list[Label]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class _Node:
    def __init__(self) -> None:
        self.log: list[Label] = []
        self.entries: list[EpochEntry] = []

    def append(self, epoch: int, start: int) -> None:
        new = appended(self.entries, epoch, start)
        if new is not None:
            self.entries = new


# weighted so that partial copies before a failover (the case that truncates) are common
_step = st.tuples(st.sampled_from(["elect", "write", "write", "sync", "sync", "sync"]), st.integers(0, 12))


@settings(max_examples=300, deadline=None)
@given(st.lists(_step, max_size=30), st.booleans())
def test_consistent_point_is_the_longest_common_prefix(steps: list[tuple[str, int]], heartbeat: bool) -> None:
    """Drive two replicas through elections (clean or not), writes and partial copies. Each epoch has one master
    and is higher than all before it; at every handshake the point must be exactly where the two logs stop
    agreeing, and after truncation and copying the replica's log is a prefix of the master's."""
    nodes = [_Node(), _Node()]
    master: int | None = None
    epoch = unit = cuts = 0
    for kind, arg in steps:
        if kind == "elect":
            master = arg % 2
            epoch += 1
            m = nodes[master]
            m.append(epoch, len(m.log))
        elif kind == "write" and master is not None:
            for _ in range(arg % 5 + 1):
                unit += 1
                nodes[master].log.append((epoch, unit))
        elif kind == "sync" and master is not None:
            m, s = nodes[master], nodes[1 - master]
            point = consistent_point(s.entries, len(s.log), m.entries, len(m.log))
            lcp = _lcp(s.log, m.log)
            if point is None:
                assert lcp == 0 and s.entries  # refused: only when nothing at all is shared
                s.log.clear()  # the operator's way out: wipe the replica
                s.entries.clear()
                point = 0
            if not s.entries:
                assert point == len(s.log) == 0
            assert point == lcp, (s.entries, s.log, m.entries, m.log)
            cuts += point < len(s.log)
            del s.log[point:]
            s.entries = truncated_suffix(s.entries, point)
            # copy up to ``arg`` units, frame by frame within an epoch, as the transfer does
            upto = min(len(m.log), len(s.log) + arg)
            while len(s.log) < upto:
                at = len(s.log)
                e, start = next((e, st_) for e, st_ in reversed(m.entries) if st_ <= at)
                if not s.entries or e > s.entries[-1].epoch:
                    s.append(e, start)
                s.log.append(m.log[at])
            if heartbeat and len(s.log) == len(m.log) and m.entries and m.entries[-1].start_offset <= len(s.log):
                s.append(*m.entries[-1])  # Java's slave records the epoch a heartbeat carries
            assert m.log[:len(s.log)] == s.log
        for n in nodes:
            starts = [e.start_offset for e in n.entries]
            assert starts == sorted(set(starts))
            assert [e.epoch for e in n.entries] == sorted({e.epoch for e in n.entries})
    target(cuts)  # steer towards histories where replicas diverge and get truncated


@given(st.lists(st.tuples(st.integers(1, 20), st.integers(0, 500)), max_size=12), st.integers(0, 600))
def test_pure_changes_keep_the_order(ops: list[tuple[int, int]], cut: int) -> None:
    entries: list[EpochEntry] = []
    for epoch, start in ops:
        try:
            new = appended(entries, epoch, start)
        except EpochFencedError:
            assert entries and epoch < entries[-1].epoch
            continue
        if new is not None:
            assert new[-1] == E(epoch, start)
            assert all(e.start_offset < start and e.epoch < epoch for e in new[:-1])
            assert new[:-1] == entries[:len(new) - 1]  # only a suffix is replaced
            entries = new
        epoch_file._check_order(entries)
    suffix = truncated_suffix(entries, cut)
    assert all(e.start_offset < cut for e in suffix) and suffix == entries[:len(suffix)]
    prefix = truncated_prefix(entries, cut)
    assert prefix == entries[len(entries) - len(prefix):]
    if entries:
        assert prefix and prefix[-1] == entries[-1]
        dropped = entries[:len(entries) - len(prefix)]
        assert all(entries[i + 1].start_offset <= cut for i in range(len(dropped)))
        assert prefix[0].start_offset <= cut or len(prefix) == len(entries)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["append", "suffix", "prefix", "reopen"]), st.integers(1, 9),
                          st.integers(0, 300)), max_size=10))
def test_file_matches_the_pure_functions(tmp_path_factory: pytest.TempPathFactory,
                                         ops: list[tuple[str, int, int]]) -> None:
    path = tmp_path_factory.mktemp("epochs") / "epochFileCheckpoint"
    with mock.patch("os.fsync"):  # durability is tested above; here only the content
        f = EpochFile(path)
        model: list[EpochEntry] = []
        for op, epoch, offset in ops:
            if op == "append":
                if model and epoch < model[-1].epoch:
                    with pytest.raises(EpochFencedError):
                        f.append(epoch, offset)
                    continue
                model = appended(model, epoch, offset) or model
                f.append(epoch, offset)
            elif op == "suffix":
                model = truncated_suffix(model, offset)
                f.truncate_suffix(offset)
            elif op == "prefix":
                model = truncated_prefix(model, offset)
                f.truncate_prefix(offset)
            else:
                f = EpochFile(path)
            assert list(f.entries) == model
        assert list(EpochFile(path).entries) == model
