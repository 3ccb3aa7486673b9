"""Scale benchmarks: what many topics and queues cost (issue 18, "cost that grows linearly").

    .venv/bin/python bench/bench_scale.py                 # every row
    .venv/bin/python bench/bench_scale.py topics queues   # chosen rows (names below)
    .venv/bin/python bench/bench_scale.py --list

Rows:

* ``topics`` -- batched sends through a real broker (``cometmq serve`` in a subprocess, one asyncio remoting client
  with pre-encoded SEND_BATCH_MESSAGE requests, ``--window`` in flight): ``--messages`` messages of ``--body`` bytes
  in batches of ``--batch``, all to one topic, then (a fresh broker) spread round-robin over ``--topics`` topics
  (queue 0 of each). Reports both rates, their ratio, the broker's CPU per message, and the disk the consume queues
  take per written queue (``st_blocks``, so sparse files count as what they hold). The topics are written into
  ``config/topics.json`` before the broker starts, so topic creation is not what is measured.
* ``queues`` -- ``--queues`` queues on one store, through the store API (``MessageStore`` in a child process, as the
  broker uses it): one message to each (``--queues-per-topic`` queues per topic), a clean stop, then a restart (time
  to ``start()``, RSS after it, a read of some queues), then a SIGKILL while writing a second message to each and a
  crash restart (recovery re-dispatches; every queue must hold its messages).

Prints one JSON object per measurement; ``# ...`` progress on stderr. Data goes to a temporary folder (BENCH_DIR to
choose) and is removed at the end. The machine is shared and small: the numbers are noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from broker_bench_common import Broker, foreign_load, log, machine_info, our_pids, report  # noqa: E402

from cometmq.net.client import RemotingClient  # noqa: E402
from cometmq.protocol.batch import encode_batch_raw  # noqa: E402
from cometmq.protocol.codes import RequestCode, ResponseCode  # noqa: E402
from cometmq.protocol.headers import SendMessageRequestHeader, send_header_to_v2  # noqa: E402
from cometmq.protocol.remoting import make_request  # noqa: E402
from cometmq.protocol.route import TopicConfig  # noqa: E402


def workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="cometmq-scale-", dir=os.environ.get("BENCH_DIR")))


def disk_of(folder: Path) -> tuple[int, int, int]:
    """(bytes allocated (st_blocks), apparent bytes, files) under ``folder``."""
    blocks = apparent = files = 0
    for dirpath, _, names in os.walk(folder):
        for name in names:
            try:
                st = os.stat(os.path.join(dirpath, name))
            except OSError:
                continue
            blocks += st.st_blocks * 512
            apparent += st.st_size
            files += 1
    return blocks, apparent, files


def free_disk(folder: Path) -> int:
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize


# ----------------------------------------------------------------------------------------------- row: topics


def _write_topics(data: Path, topics: list[str], queues: int) -> None:
    cfg = data / "config"
    cfg.mkdir(parents=True, exist_ok=True)
    table = {t: TopicConfig(t, queues, queues).to_json() for t in topics}
    (cfg / "topics.json").write_text(json.dumps({"topicConfigTable": table,
                                                 "dataVersion": {"timestamp": 0, "counter": 1}}))


def _batch_requests(topics: list[str], messages: int, batch: int, body: int) -> list[Any]:
    """Pre-encoded batch sends: batch i goes to queue 0 of topic i % len(topics)."""
    payload = b"x" * body
    out = []
    n = 0
    i = 0
    while n < messages:
        k = min(batch, messages - n)
        items = [(payload, f"UNIQ_KEY\x01{i:08X}{j:024X}\x02WAIT\x01true\x02".encode(), 0) for j in range(k)]
        header = SendMessageRequestHeader(producer_group="scale_pg", topic=topics[i % len(topics)], queue_id=0,
                                          born_timestamp=int(time.time() * 1000), properties="", batch=True)
        out.append((send_header_to_v2(header), encode_batch_raw(items), k))
        n += k
        i += 1
    return out


async def _send_all(addr: str, requests: list[Any], window: int) -> tuple[float, int]:
    """Send every request, ``window`` in flight; returns (seconds, messages stored)."""
    stored = 0
    async with RemotingClient() as cli:
        # one warm-up send to open the connection
        ext, body, _ = requests[0]
        rep = await cli.invoke(addr, make_request(RequestCode.SEND_BATCH_MESSAGE, ext, body), 10)
        if rep.code != ResponseCode.SUCCESS:
            raise RuntimeError(f"send failed: {rep.code} {rep.remark}")
        it = iter(requests[1:])
        stored += requests[0][2]

        async def worker() -> None:
            nonlocal stored
            for ext, body, k in it:
                r = await cli.invoke(addr, make_request(RequestCode.SEND_BATCH_MESSAGE, ext, body), 30)
                if r.code != ResponseCode.SUCCESS:
                    raise RuntimeError(f"send failed: {r.code} {r.remark}")
                stored += k

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(window)))
        return time.perf_counter() - t0, stored


def _run_sends(topics: list[str], args: argparse.Namespace, label: str) -> dict[str, Any]:
    wd = workdir()
    broker = None
    try:
        data = wd / "data"
        _write_topics(data, topics, 4)
        requests = _batch_requests(topics, args.messages, args.batch, args.body)
        free0 = free_disk(wd)
        broker = Broker(wd)
        load = foreign_load(our_pids(broker), 0.3)
        cpu0 = broker.cpu()
        seconds, stored = asyncio.run(_send_all(broker.addr, requests, args.window))
        cpu = broker.cpu() - cpu0
        rss = broker.rss_mib()
        # New consume-queue files are made by the broker's flush pass (within flushIntervalConsumeQueue): give it a
        # few passes, then count its CPU until then too, then stop it cleanly (everything on disk) and measure.
        time.sleep(3)
        cpu_settled = broker.cpu() - cpu0
        broker.stop()
        broker = None
        written_queues = len({ext["b"] for ext, _, _ in requests})
        blocks, apparent, files = disk_of(data / "consumequeue")
        row = report(bench="scale", row="topics", case=label, topics=len(topics), written_queues=written_queues,
                     messages=stored, body=args.body, batch=args.batch, window=args.window,
                     msgs_per_s=round(stored / seconds), seconds=round(seconds, 2),
                     broker_cpu_us_per_msg=round(cpu / stored * 1e6, 1),
                     broker_cpu_us_per_msg_with_3s_after=round(cpu_settled / stored * 1e6, 1), broker_rss_mib=rss,
                     cq_files=files, cq_disk_bytes=blocks, cq_apparent_bytes=apparent,
                     cq_disk_bytes_per_written_queue=round(blocks / max(1, written_queues)),
                     disk_free_drop_bytes=max(0, free0 - free_disk(wd)), **load)
        return row
    finally:
        if broker is not None:
            broker.stop()
        shutil.rmtree(wd, ignore_errors=True)


def row_topics(args: argparse.Namespace) -> None:
    log(f"topics: {args.messages} messages of {args.body} B in batches of {args.batch}, one topic")
    one = _run_sends(["ScaleOne"], args, "one_topic")
    log(f"topics: the same over {args.topics} topics")
    many = _run_sends([f"Scale{i:05d}" for i in range(args.topics)], args, f"{args.topics}_topics")
    ratio = many["msgs_per_s"] / one["msgs_per_s"]
    per_queue = many["cq_disk_bytes_per_written_queue"]
    report(bench="scale", row="topics", case="summary", one_topic_msgs_per_s=one["msgs_per_s"],
           many_topics_msgs_per_s=many["msgs_per_s"], topics=args.topics, ratio=round(ratio, 3),
           cq_disk_bytes_per_written_queue=per_queue, ratio_ok=ratio >= 0.70, disk_ok=per_queue <= 1 << 20)


# ----------------------------------------------------------------------------------------------- row: queues

_CHILD = r"""
import json, os, sys, time
import psutil
from pathlib import Path
from cometmq.protocol.properties import encode_properties
from cometmq.store.config import StoreConfig
from cometmq.store.message import MessageInner
from cometmq.store.message_store import MessageStore
from cometmq.store.status import GetStatus

mode, path, queues, per_topic = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
topics = (queues + per_topic - 1) // per_topic
keys = [(f"Q{q // per_topic:06d}", q % per_topic) for q in range(queues)]
def out(**kw):
    print(json.dumps(kw), flush=True)
def rss():
    return round(psutil.Process().memory_info().rss / 2**20, 1)
def anon():  # RSS less its file-backed pages (mapped commit-log and consume-queue files the kernel can drop)
    m = psutil.Process().memory_info()
    return round((m.rss - m.shared) / 2**20, 1)
t0 = time.perf_counter()
store = MessageStore(StoreConfig(store_path=path))
store.start()
started = time.perf_counter() - t0
out(event="started", seconds=round(started, 3), rss_mib=rss(), anon_mib=anon(), abnormal=store.recovered_abnormally,
    queues_loaded=len(store.queues))
if mode in ("write", "crash"):
    round_no = 0 if mode == "write" else 1
    body = b"y" * 100
    t0 = time.perf_counter()
    chunk = 512
    for i in range(0, queues, chunk):
        msgs = []
        for topic, qid in keys[i:i + chunk]:
            props = {"UNIQ_KEY": f"{round_no}-{topic}-{qid}", "TAGS": "t"}
            msgs.append(MessageInner(topic=topic, body=body, queue_id=qid, properties=props,
                                     properties_raw=encode_properties(props)))
        r = store.put_messages(msgs)
        assert r.status.name == "PUT_OK", r
        if mode == "crash" and i + chunk >= queues:
            out(event="written", seconds=round(time.perf_counter() - t0, 3), rss_mib=rss())
            time.sleep(3600)  # the parent kills us here (SIGKILL): no clean stop
    out(event="written", seconds=round(time.perf_counter() - t0, 3), rss_mib=rss())
if mode == "check":
    expect = int(sys.argv[5])
    bad = 0
    step = max(1, queues // 2000)
    for topic, qid in keys[::step]:
        r = store.get_messages(topic, qid, 0, 32)
        if r.status is not GetStatus.FOUND or len(r.buffers) != expect:
            bad += 1
    out(event="checked", sampled=len(keys[::step]), bad=bad, rss_mib=rss(), anon_mib=anon())
t0 = time.perf_counter()
store.shutdown()
out(event="stopped", seconds=round(time.perf_counter() - t0, 3))
"""


def _child(args: list[str], until: str | None = None, timeout: float = 1800) -> tuple[list[dict[str, Any]],
                                                                                        subprocess.Popen[str]]:
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, *args], stdout=subprocess.PIPE, text=True)
    events: list[dict[str, Any]] = []
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        events.append(json.loads(line))
        if until is not None and events[-1].get("event") == until:
            return events, proc
        if time.monotonic() > deadline:
            break
    proc.wait(timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"store child {args[0]} failed (rc {proc.returncode}): {events}")
    return events, proc


def _event(events: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(e for e in events if e.get("event") == name)


def row_queues(args: argparse.Namespace) -> None:
    wd = workdir()
    try:
        path = wd / "store"
        q, per = str(args.queues), str(args.queues_per_topic)
        log(f"queues: one message to each of {args.queues} queues ({args.queues_per_topic} a topic), store API")
        ev, _ = _child(["write", str(path), q, per])
        written = _event(ev, "written")
        blocks, apparent, files = disk_of(path / "consumequeue")
        log("queues: clean restart")
        ev, _ = _child(["check", str(path), q, per, "1"])
        started, checked = _event(ev, "started"), _event(ev, "checked")
        report(bench="scale", row="queues", case="clean_restart", queues=args.queues, api="store",
               write_seconds=written["seconds"], write_rss_mib=written["rss_mib"],
               restart_seconds=started["seconds"], rss_after_restart_mib=started["rss_mib"],
               anon_after_restart_mib=started["anon_mib"], rss_after_reads_mib=checked["rss_mib"],
               anon_after_reads_mib=checked["anon_mib"], queues_loaded=started["queues_loaded"],
               sampled=checked["sampled"], bad=checked["bad"], cq_files=files, cq_disk_bytes=blocks,
               cq_apparent_bytes=apparent, cq_disk_bytes_per_queue=round(blocks / max(1, args.queues)),
               restart_ok=started["seconds"] <= 10)
        log("queues: a second message to each, SIGKILL, crash restart")
        ev, proc = _child(["crash", str(path), q, per], until="written")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        ev, _ = _child(["check", str(path), q, per, "2"])
        started, checked = _event(ev, "started"), _event(ev, "checked")
        report(bench="scale", row="queues", case="crash_restart", queues=args.queues, api="store",
               restart_seconds=started["seconds"], abnormal=started["abnormal"],
               rss_after_restart_mib=started["rss_mib"], anon_after_restart_mib=started["anon_mib"],
               rss_after_reads_mib=checked["rss_mib"], anon_after_reads_mib=checked["anon_mib"],
               sampled=checked["sampled"], bad=checked["bad"], restart_ok=started["seconds"] <= 10)
    finally:
        shutil.rmtree(wd, ignore_errors=True)


ROWS: dict[str, tuple[Callable[[argparse.Namespace], None], str]] = {
    "topics": (row_topics, "batched sends over many topics vs one topic; consume-queue disk per written queue"),
    "queues": (row_queues, "many queues on one store: write one message each, restart time, RSS, crash restart"),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("rows", nargs="*", help=f"rows to run (default: all): {', '.join(ROWS)}")
    ap.add_argument("--list", action="store_true", help="list the rows and exit")
    ap.add_argument("--messages", type=int, default=200_000, help="topics: messages per case")
    ap.add_argument("--body", type=int, default=100, help="topics: body bytes")
    ap.add_argument("--batch", type=int, default=32, help="topics: messages per batch send")
    ap.add_argument("--window", type=int, default=8, help="topics: batch sends in flight")
    ap.add_argument("--topics", type=int, default=5000, help="topics: topics of the spread case")
    ap.add_argument("--queues", type=int, default=100_000, help="queues: queues on the store")
    ap.add_argument("--queues-per-topic", type=int, default=4, help="queues: queues a topic")
    args = ap.parse_args()
    if args.list:
        for name, (_, what) in ROWS.items():
            print(f"{name:8} {what}")
        return
    unknown = [r for r in args.rows if r not in ROWS]
    if unknown:
        ap.error(f"unknown row(s) {unknown}; rows: {', '.join(ROWS)}")
    info = machine_info()
    report(bench="scale", row="machine", **info, loadavg_1m=round(os.getloadavg()[0], 2),
           cpu_percent=psutil.cpu_percent(0.5))
    for name in args.rows or list(ROWS):
        ROWS[name][0](args)


if __name__ == "__main__":
    main()
