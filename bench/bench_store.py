"""Store benchmarks: append, SYNC_FLUSH group commit, read, recovery and memory.

    .venv/bin/python bench/bench_store.py all          # everything (several minutes, ~2 GiB of disk)
    .venv/bin/python bench/bench_store.py append       # one part: append | sync | read | recovery | memory | replica

Prints one JSON object per measurement. Data goes to a temporary folder (BENCH_DIR to choose).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil

from cometmq.broker.appender import Appender
from cometmq.broker.offset_waiter import OffsetWaiter
from cometmq.net.loop import run as run_loop
from cometmq.protocol.properties import encode_properties
from cometmq.store.config import FlushDiskType, StoreConfig
from cometmq.store.dispatch import ReputService
from cometmq.store.message import MessageInner
from cometmq.store.message_store import MessageStore


def report(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def workdir() -> Path:
    base = os.environ.get("BENCH_DIR")
    return Path(tempfile.mkdtemp(prefix="cometmq-bench-", dir=base))


def make_messages(n: int, size: int, topic: str = "Bench", queues: int = 8) -> list[MessageInner]:
    """Messages as the broker hands them to the store: properties parsed and also still encoded (the
    producer's request carries them encoded; the broker parses them once for tags and keys)."""
    body = b"x" * size
    out = []
    for i in range(n):
        props = {"UNIQ_KEY": f"{i:032X}", "TAGS": "T"}
        out.append(MessageInner(topic=topic, body=body, queue_id=i % queues, properties=props,
                                properties_raw=encode_properties(props)))
    return out


def bench_append(total: int) -> None:
    for size in (100, 1024):
        for batch in (1, 64):
            for index in (False, True):
                path = workdir()
                store = MessageStore(StoreConfig(store_path=path, message_index_enable=index))
                store.start()
                msgs = make_messages(batch, size)
                rounds = total // batch
                cpu0, t0 = time.process_time(), time.perf_counter()
                for _ in range(rounds):
                    if batch == 1:
                        store.put_message(msgs[0])
                    else:
                        store.put_messages(msgs)
                wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
                n = rounds * batch
                report(bench="append", body=size, batch=batch, index=index, flush="ASYNC_FLUSH", records=n,
                       records_per_s=round(n / wall), cpu_us_per_record=round(cpu / n * 1e6, 2))
                store.shutdown()
                shutil.rmtree(path)


async def _sync_writers(store: MessageStore, writers: int, per_writer: int, size: int, batcher: bool) -> float:
    loop = asyncio.get_running_loop()
    waiter = OffsetWaiter(loop, store.flushed_offset)
    store.add_flush_listener(waiter.on_flushed)
    msg = make_messages(1, size)[0]
    # The broker's one write path (broker/appender.py), as its controller builds it.
    appender = Appender(store, sync_flush_timeout_s=5.0)
    appender.start(loop)

    async def writer() -> None:
        for _ in range(per_writer):
            if batcher:
                res = await appender.put([msg])  # resolves once flushed
                assert res.ok
            else:
                res = store.put_message(msg)
                assert res.ok and await waiter.wait(res.end_offset, 5.0)

    t0 = time.perf_counter()
    await asyncio.gather(*(writer() for _ in range(writers)))
    return time.perf_counter() - t0


def bench_sync(total: int) -> None:
    """Each writer appends one record and waits for the fsync covering it. ``via``: "store" calls
    ``store.put_message`` per record; "broker" goes through the broker's Appender, which coalesces the
    appends that arrive in one event-loop turn into one batch append (what the broker's send path does)."""
    for writers, via, inline_max_us in ((1, "store", 0), (64, "store", 0), (64, "broker", 0), (64, "broker", 2000)):
        path = workdir()
        store = MessageStore(StoreConfig(store_path=path, flush_disk_type=FlushDiskType.SYNC_FLUSH,
                                         group_commit_inline_max_us=inline_max_us))
        store.start()
        per = max(1, (total if writers > 1 else total // 20) // writers)
        wall = run_loop(_sync_writers(store, writers, per, 100, via == "broker"))  # uvloop, as the broker runs
        n = per * writers
        report(bench="sync_flush", writers=writers, via=via, group_commit_inline_max_us=inline_max_us, body=100,
               records=n, acked_per_s=round(n / wall), fsyncs=store.flush_service.flush_count,
               fsync_ms_avg=round(store.flush_service.flush_seconds_avg * 1e3, 3),
               records_per_fsync=round(n / max(1, store.flush_service.flush_count), 1))
        store.shutdown()
        shutil.rmtree(path)


def bench_read(total: int) -> None:
    path = workdir()
    store = MessageStore(StoreConfig(store_path=path, message_index_enable=False))
    store.start()
    msgs = make_messages(64, 100, queues=1)
    for _ in range(total // 64):
        store.put_messages(msgs)
    n = 0
    t0 = time.perf_counter()
    offset = 0
    while True:
        r = store.get_messages("Bench", 0, offset, 32)
        if not r.buffers:
            break
        n += len(r.buffers)
        offset = r.next_begin_offset
    wall = time.perf_counter() - t0
    report(bench="read", records=n, records_per_s=round(n / wall), batch=32)
    store.shutdown()
    shutil.rmtree(path)


def bench_replica(total: int, chunk: int = 20_000) -> None:
    """A replica's append path: a master's log (batches of 128 records of 100 B) copied in ``chunk``-byte pieces
    with ``append_raw``, as replication ships it (chunks end mid-record), each piece dispatched from the log.
    ``cpu_us_per_record``: the whole copy (append, decode, consume-queue units, key index); ``decode_us_per_record``:
    the dispatcher's decode alone, re-run over the replica's log with no dispatchers; ``master_cpu_us_per_record``:
    the master's own append of the same records, for comparison."""
    for index in (True, False):
        path = workdir()
        master = MessageStore(StoreConfig(store_path=path / "master", message_index_enable=index))
        master.start()
        msgs = make_messages(128, 100)
        rounds = max(1, total // 128)
        cpu0 = time.process_time()
        for _ in range(rounds):
            master.put_messages(msgs)
        master_cpu = time.process_time() - cpu0
        replica = MessageStore(StoreConfig(store_path=path / "replica", message_index_enable=index))
        replica.start()
        end = master.commitlog.max_offset
        files = master.commitlog.files
        pieces = []
        offset = 0
        while offset < end:  # read ahead, so that the timing is the replica's work alone
            mf = files.find(offset)
            assert mf is not None
            pos = offset - mf.file_from_offset
            n = min(chunk, mf.wrote_position - pos)
            pieces.append((offset, bytes(mf.view(pos, n))))
            offset += n
        cpu0, t0 = time.process_time(), time.perf_counter()
        for offset, data in pieces:
            assert replica.append_raw(offset, data)
        if replica.index_builder is not None:
            replica.index_builder.drain()
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        n = rounds * 128
        assert replica.reput.reput_offset == end
        decoder = ReputService(replica.commitlog)  # no dispatchers, no listeners: the decode alone
        cpu0 = time.process_time()
        assert decoder.reput_from_log(end, notify=False) == n
        decode = time.process_time() - cpu0
        report(bench="replica", body=100, batch=128, chunk=chunk, index=index, records=n,
               records_per_s=round(n / wall), cpu_us_per_record=round(cpu / n * 1e6, 2),
               decode_us_per_record=round(decode / n * 1e6, 2),
               master_cpu_us_per_record=round(master_cpu / n * 1e6, 2))
        replica.shutdown()
        master.shutdown()
        shutil.rmtree(path)


FILLER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from cometmq.store.config import StoreConfig
    from cometmq.store.message import MessageInner
    from cometmq.store.dispatch import ReputService
from cometmq.store.message_store import MessageStore
    store = MessageStore(StoreConfig(store_path=Path(sys.argv[1])))
    store.start()
    target = int(sys.argv[2])
    msgs = [MessageInner(topic="Bench", body=b"r" * 1024, queue_id=i % 8,
                         properties={"UNIQ_KEY": f"{i:032X}", "KEYS": f"k{i}"}) for i in range(64)]
    while store.commitlog.max_offset < target:
        store.put_messages(msgs)
    print("full", flush=True)
    import time
    time.sleep(3600)
    """
)


def bench_recovery(log_bytes: int) -> None:
    path = workdir()
    proc = subprocess.Popen([sys.executable, "-c", FILLER, str(path), str(log_bytes)], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    proc.stdout.readline()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    for kind in ("after kill -9", "clean restart"):
        t0 = time.perf_counter()
        store = MessageStore(StoreConfig(store_path=path))
        store.start()
        wall = time.perf_counter() - t0
        report(bench="recovery", kind=kind, log_bytes=store.commitlog.max_offset, seconds=round(wall, 3),
               abnormal=store.recovered_abnormally)
        store.shutdown()
    shutil.rmtree(path)


def bench_memory(counts: list[int]) -> None:
    path = workdir()
    store = MessageStore(StoreConfig(store_path=path, commitlog_segment_size=256 << 20))
    store.start()
    msgs = make_messages(64, 100)
    proc = psutil.Process()
    written = 0
    for target in counts:
        while written < target:
            store.put_messages(msgs)
            written += 64
        time.sleep(1.5)  # let the flush services flush and unmap what is behind the tail
        report(bench="memory", records=written, log_bytes=store.commitlog.max_offset,
               rss_mib=round(proc.memory_info().rss / 2**20, 1))
    store.shutdown()
    shutil.rmtree(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=["all", "append", "sync", "read", "recovery", "memory", "replica"])
    parser.add_argument("--quick", action="store_true", help="smaller counts, for a smoke run")
    args = parser.parse_args()
    q = args.quick
    report(bench="machine", cpus=os.cpu_count(), python=platform.python_version(), platform=platform.platform())
    if args.part in ("all", "append"):
        bench_append(20_000 if q else 500_000)
    if args.part in ("all", "sync"):
        bench_sync(10_000 if q else 200_000)
    if args.part in ("all", "read"):
        bench_read(50_000 if q else 1_000_000)
    if args.part in ("all", "recovery"):
        bench_recovery((32 << 20) if q else (1 << 30))
    if args.part in ("all", "memory"):
        bench_memory([100_000, 200_000] if q else [1_000_000, 5_000_000])
    if args.part in ("all", "replica"):
        bench_replica(12_800 if q else 128_000)


if __name__ == "__main__":
    main()
