"""Consume queues with a queue offset gap (a record naming a queue offset past its queue's end: a replica's log, a
recovered log, a dispatch after a hole): the gap's units are written empty (zeros), the record's unit after them.
A restart, clean or after SIGKILL, must find the units after the gap."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from cometmq.protocol.message import decode_record
from cometmq.store.config import CQ_UNIT_SIZE
from cometmq.store.message_store import MessageStore
from tests.kit import FakeClock

from .conftest import SYNC, msg, small_config
from .test_recovery import reopen


def served(store: MessageStore, topic: str = "T", queue_id: int = 0) -> dict[int, bytes]:
    """Every record the queue serves, by queue offset (reads walk over the gap's empty units)."""
    out: dict[int, bytes] = {}
    offset, end = store.min_offset(topic, queue_id), store.max_offset(topic, queue_id)
    while offset < end:
        r = store.get_messages(topic, queue_id, offset, 32)
        for qoff, v in zip(r.queue_offsets, r.buffers, strict=True):
            out[qoff] = decode_record(v, check_crc=True)[0].body
        assert r.next_begin_offset > offset, r
        offset = r.next_begin_offset
    return out


def put_with_gaps(store: MessageStore, plan: list[tuple[int, int]]) -> dict[int, bytes]:
    """For each (queue offset, count): the next record of T-0 names that queue offset (the queue's end moved past
    it: the abnormal case the dispatch writes empty units for), then ``count`` records follow on."""
    want: dict[int, bytes] = {}
    for start, count in plan:
        if start > store.max_offset("T", 0):
            store.commitlog.queue_table[("T", 0)] = start
        for i in range(count):
            body = b"gap-%d-" % (start + i) * 8
            res = store.put_message(msg(body=body))
            assert res.ok and res.records[0].queue_offset == start + i
            want[start + i] = body
    return want


def check(store: MessageStore, want: dict[int, bytes]) -> None:
    top = max(want) + 1
    assert store.max_offset("T", 0) == top
    assert served(store) == want
    res = store.put_message(msg(body=b"after the restart"))
    assert res.records[0].queue_offset == top  # not over an old unit
    assert served(store) == {**want, top: b"after the restart"}


def test_a_gap_in_the_middle_of_the_last_file_survives_a_restart(tmp_path: Path, clock: FakeClock) -> None:
    # Units 0-4, empty 5-149, units 150-159 in one file. The count of the units in use was a binary search for the
    # first empty unit: it landed in the gap, the queue came back 5 units long and served nothing past it.
    store = reopen(tmp_path / "s", clock, consume_queue_units_per_file=1000)
    want = put_with_gaps(store, [(0, 5), (150, 10)])
    assert served(store) == want
    store.shutdown()
    store = reopen(tmp_path / "s", clock, consume_queue_units_per_file=1000)
    try:
        check(store, want)
    finally:
        store.shutdown()
    store = reopen(tmp_path / "s", clock, consume_queue_units_per_file=1000)
    try:
        assert store.max_offset("T", 0) == 161
    finally:
        store.shutdown()


def test_gaps_across_a_file_boundary_and_inside_the_last_file_survive_a_restart(tmp_path: Path,
                                                                                clock: FakeClock) -> None:
    # 64 units a file: units 0-2, empty 3-69 (across the first file's end), units 70-72, empty 73-109, 110-114.
    store = reopen(tmp_path / "s", clock)
    want = put_with_gaps(store, [(0, 3), (70, 3), (110, 5)])
    store.shutdown()
    store = reopen(tmp_path / "s", clock)
    try:
        check(store, want)
    finally:
        store.shutdown()


def test_a_torn_unit_after_a_gap_is_still_cut(tmp_path: Path, clock: FakeClock) -> None:
    # Past the last unit, a unit half written (its commit-log offset, no size: a power cut) is no unit: it is
    # dropped, and the queue goes on from the last whole unit.
    path = tmp_path / "s"
    store = reopen(path, clock, consume_queue_units_per_file=1000)
    want = put_with_gaps(store, [(0, 5), (150, 10)])
    store.shutdown()
    cq_file = path / "consumequeue" / "T" / "0" / f"{0:020d}"
    with open(cq_file, "r+b") as f:
        f.seek(160 * CQ_UNIT_SIZE)
        f.write((12345).to_bytes(8, "big"))
    store = reopen(path, clock, consume_queue_units_per_file=1000)
    try:
        check(store, want)
    finally:
        store.shutdown()


def test_retention_keeps_a_first_file_that_ends_in_a_gap(tmp_path: Path, clock: FakeClock) -> None:
    # T-0's first file holds units 0-2 then empty units to its end (the gap runs into the next file). Retention asked
    # its last unit whether its record was gone: an empty unit (commit-log offset 0) said so, and the file went with
    # units 0-2 whose records are still in the log.
    store = reopen(tmp_path / "s", clock, commitlog_segment_size=4096, file_reserved_time_h=1)
    try:
        while len(store.commitlog.files.files) < 2:
            assert store.put_message(msg(topic="F", body=b"f" * 300)).ok
        want = put_with_gaps(store, [(0, 3), (70, 3)])
        first = store.commitlog.files.files[0]
        assert store.queues[("T", 0)].get_unit(0)[0] >= first.end_offset  # type: ignore[index]
        old = time.time() - 3 * 3600
        os.utime(first.path, (old, old))
        assert store.cleaner.delete_expired(clock.now) == 1
        assert store.min_offset("T", 0) == 0 and store.min_offset("F", 0) > 0
        check(store, want)
    finally:
        store.shutdown()


WRITER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from tests.store.conftest import SYNC, msg, small_config
    from tests.store.test_cq_gap import put_with_gaps
    from cometmq.store.message_store import MessageStore
    store = MessageStore(small_config(Path(sys.argv[1]), consume_queue_units_per_file=1000, flush_disk_type=SYNC,
                                      message_index_enable=False))
    store.start()
    want = put_with_gaps(store, [(0, 5), (150, 10)])
    store.flush_and_checkpoint()  # as the flush service does every second: the checkpoint is past every unit
    dispatched = json.loads(store.checkpoint_file.read_bytes())["dispatched_offset"]
    print(json.dumps([sorted(want), dispatched == store.commitlog.max_offset]), flush=True)
    time.sleep(600)
    """
)


def test_units_after_a_gap_survive_sigkill(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "s"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True, env=env,
                            cwd=Path(__file__).parents[2])
    try:
        assert proc.stdout is not None
        acked, checkpoint_past_all = json.loads(proc.stdout.readline())
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()
    assert acked == [*range(5), *range(150, 160)] and checkpoint_past_all
    store = MessageStore(small_config(path, consume_queue_units_per_file=1000, flush_disk_type=SYNC,
                                      message_index_enable=False), clock=clock)
    store.start()
    try:
        assert store.recovered_abnormally
        check(store, {q: b"gap-%d-" % q * 8 for q in acked})
    finally:
        store.shutdown()
