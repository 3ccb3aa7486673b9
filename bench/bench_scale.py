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
* ``create`` and ``nameserver`` -- bench_scale_topics.py's rows, run from here: ``--create-topics`` topics created one
  after another through the admin client (time per 1,000, first against last); one nameserver and ``--ns-brokers``
  simulated brokers of ``--ns-broker-topics`` topics (CPU per periodic round, CPU per route query, route latency).
* ``connections`` -- ``--connections`` idle remoting connections to a ``cometmq serve`` subprocess: broker memory per
  connection, broker CPU per producer heartbeat, per consumer heartbeat in full (4.x clients) and per
  fingerprint-only heartbeat (RocketMQ 5's heartbeat v2).
* ``consumers`` -- one consumer group of ``--consumers`` push consumers (a comma list: ``50,200,500,1000``; default
  1000) on one topic of ``--consumer-queues`` queues (64), created with the admin client on a ``cometmq serve``
  subprocess. The consumers are SDK ``PushConsumer`` objects, each with its own client instance (its own client id
  and connections), spread over ``--consumer-procs`` child processes (4), each one asyncio loop starting its share
  at once. Reports the time until the group settled (every queue of the topic owned by exactly one consumer, as the
  consumers report their assignments, unchanged for ``--settle-quiet`` s), from the first start and from the last
  consumer's start; the heartbeats and rebalances that failed (the SDK's warnings, counted in the children:
  ``hb_failures`` heartbeats, ``rebalance_failures`` failed topic rebalances, ``list_failures`` consumer lists not
  obtained); the NOTIFY_CONSUMER_IDS_CHANGED the consumers were sent (``notices``, all of them together); and the
  broker's CPU per second while steady (psutil over ``--steady`` s, 10; 40 covers a heartbeat round, every 30 s).

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
from contextlib import suppress
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


# -------------------------------------------------------------------------------------------- row: consumers

_CONSUMERS_CHILD = r"""
import asyncio, json, logging, os, sys, time
from cometmq.client.instance import ClientInstance
from cometmq.client.push_consumer import PushConsumer

namesrv, topic, group, count, index = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
counts = {"hb_failures": 0, "rebalance_failures": 0, "list_failures": 0, "other_warnings": 0, "notices": 0}


class Count(logging.Handler):
    def emit(self, record):
        msg = record.msg if isinstance(record.msg, str) else ""
        if msg.startswith("request %d to %s failed") and record.args and record.args[0] == 34:
            counts["hb_failures"] += 1
        elif msg.startswith("rebalance of %s for group %s failed"):
            counts["rebalance_failures"] += 1
        elif msg.startswith("cannot list the consumers"):
            counts["list_failures"] += 1
        elif msg.startswith("consumers of %s changed"):
            counts["notices"] += 1
        elif record.levelno >= logging.WARNING:
            counts["other_warnings"] += 1


logging.getLogger("cometmq").addHandler(Count())
logging.getLogger("cometmq").setLevel(logging.INFO)
logging.getLogger("cometmq").propagate = False
logging.getLogger("cometmq.client.push_consumer").setLevel(logging.DEBUG)  # a NOTIFY_CONSUMER_IDS_CHANGED taken


async def handle(msgs):
    return None


def out(**kw):
    sys.stdout.write(json.dumps(kw) + "\n")
    sys.stdout.flush()


async def main():
    consumers = []
    for i in range(count):
        inst = ClientInstance(namesrv, instance_name=f"bench{index}-{i}")
        c = PushConsumer(group, instance=inst, listener=handle)
        c.subscribe(topic, "*")
        consumers.append(c)
    out(event="created", t=time.time())
    started = 0

    async def start(c):
        nonlocal started
        await c.start()
        started += 1

    async def report():
        while True:
            owners = {}
            for c in consumers:
                for mq in c.assignment:
                    if mq.topic == topic:
                        owners.setdefault(mq.queue_id, []).append(c.instance.client_id)
            out(event="state", t=time.time(), started=started, owners=owners, **counts)
            await asyncio.sleep(0.25)

    reporter = asyncio.ensure_future(report())
    await asyncio.gather(*(start(c) for c in consumers))
    out(event="started", t=time.time(), ids=[c.instance.client_id for c in consumers])
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)  # the parent says when to stop
    reporter.cancel()
    await asyncio.gather(*(c.close() for c in consumers), return_exceptions=True)
    out(event="closed", t=time.time(), **counts)


asyncio.run(main())
"""


def _consumers_case(args: argparse.Namespace, n: int) -> dict[str, Any]:
    import threading

    wd = workdir()
    broker = None
    children: list[subprocess.Popen[str]] = []
    try:
        broker = Broker(wd)
        topic, group = "ScaleConsumers", "scale_cg"

        async def create() -> None:
            from cometmq.client.admin import Admin

            async with Admin(namesrv=broker.namesrv) as admin:  # type: ignore[union-attr]
                await admin.create_topic(topic, read_queues=args.consumer_queues)

        asyncio.run(create())
        procs = max(1, min(args.consumer_procs, n))
        shares = [n // procs + (1 if i < n % procs else 0) for i in range(procs)]
        latest: dict[int, dict[str, Any]] = {}
        started_at: dict[int, float] = {}
        lock = threading.Lock()
        history: list[tuple[float, Any]] = []  # (time seen, combined owners) at every change
        all_ids: list[str] = []

        def reader(i: int, proc: subprocess.Popen[str]) -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                ev = json.loads(line)
                with lock:
                    if ev["event"] == "state":
                        latest[i] = ev
                        combined: dict[int, list[str]] = {}
                        for st in latest.values():
                            for q, ids in st["owners"].items():
                                combined.setdefault(int(q), []).extend(ids)
                        key = tuple(sorted((q, tuple(sorted(ids))) for q, ids in combined.items()))
                        if not history or history[-1][1] != key:
                            history.append((time.time(), key))
                    elif ev["event"] == "started":
                        started_at[i] = ev["t"]
                        all_ids.extend(ev["ids"])
                    elif ev["event"] == "closed":
                        latest[i] = {**latest.get(i, {}), **ev}

        load0 = os.getloadavg()[0]
        t0 = time.time()
        for i, share in enumerate(shares):
            proc = subprocess.Popen([sys.executable, "-c", _CONSUMERS_CHILD, broker.namesrv, topic, group, str(share),
                                     str(i)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            children.append(proc)
            threading.Thread(target=reader, args=(i, proc), daemon=True).start()

        def valid(key: Any) -> bool:
            return len(key) == args.consumer_queues and all(len(ids) == 1 for _, ids in key)

        deadline = t0 + args.settle_timeout
        settled_at: float | None = None
        while time.time() < deadline:
            time.sleep(0.25)
            with lock:
                all_started = len(started_at) == procs
                last_t, last_key = history[-1] if history else (0.0, ())
            if all_started and valid(last_key) and time.time() - last_t >= args.settle_quiet:
                settled_at = last_t
                break
        all_started_t = max(started_at.values()) if len(started_at) == procs else None
        with lock:
            changes = len(history)
            final = history[-1][1] if history else ()
        # what every consumer should own once all see the whole group (the SDK's default strategy)
        from cometmq.client.rebalance import AllocateAverage
        from cometmq.protocol.client_bodies import MessageQueue

        mqs = [MessageQueue(topic, "broker", q) for q in range(args.consumer_queues)]
        ids = sorted(all_ids)
        expected = tuple(sorted((mq.queue_id, (cid,)) for cid in ids[:args.consumer_queues]
                                for mq in AllocateAverage().allocate(group, cid, mqs, ids)))
        log(f"consumers {n}: {'settled' if settled_at else 'NOT settled'} after "
            f"{(settled_at or time.time()) - t0:.1f} s, {changes} assignment changes seen")
        cpu0, w0 = broker.cpu(), time.time()
        time.sleep(args.steady)
        steady_cpu = (broker.cpu() - cpu0) / (time.time() - w0)
        with lock:
            changed_while_steady = bool(history) and history[-1][0] > w0
        for proc in children:
            with suppress(OSError):
                assert proc.stdin is not None
                proc.stdin.write("\n")
                proc.stdin.flush()
        for proc in children:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        time.sleep(0.2)
        with lock:
            totals = {k: sum(int(st.get(k, 0)) for st in latest.values())
                      for k in ("hb_failures", "rebalance_failures", "list_failures", "other_warnings", "notices")}
        import cometmq

        return report(bench="scale", row="consumers", consumers=n, queues=args.consumer_queues, processes=procs,
                      cometmq_src=str(Path(cometmq.__file__).parent),
                      settled=settled_at is not None,
                      settle_s=round(settled_at - t0, 2) if settled_at else None,
                      settle_after_last_start_s=(round(settled_at - all_started_t, 2)
                                                 if settled_at and all_started_t else None),
                      all_started_s=round(all_started_t - t0, 2) if all_started_t else None,
                      assignment_changes=changes, changed_while_steady=changed_while_steady,
                      final_as_expected=final == expected, **totals,
                      steady_broker_cpu_s_per_s=round(steady_cpu, 4), broker_rss_mib=broker.rss_mib(),
                      loadavg_1m_before=round(load0, 2), loadavg_1m_after=round(os.getloadavg()[0], 2))
    finally:
        for proc in children:
            if proc.poll() is None:
                proc.kill()
        if broker is not None:
            broker.stop()
        shutil.rmtree(wd, ignore_errors=True)


def row_consumers(args: argparse.Namespace) -> None:
    for n in [int(x) for x in str(args.consumers).split(",") if x.strip()]:
        log(f"consumers: {n} push consumers of one group on {args.consumer_queues} queues, "
            f"{args.consumer_procs} processes")
        _consumers_case(args, n)


def row_connections(args: argparse.Namespace) -> None:
    """Idle client connections on one `cometmq serve`: memory per connection; broker CPU per producer heartbeat,
    per consumer heartbeat in full (4.x, and v2's first) and per fingerprint-only one (heartbeat v2)."""
    from cometmq.protocol.client_bodies import ConsumerData, HeartbeatData, SubscriptionData

    n = args.connections
    wd = workdir()
    broker = Broker(wd)
    try:
        async def run() -> dict[str, Any]:
            clients = [RemotingClient() for _ in range(n)]
            try:
                await asyncio.sleep(2)
                rss0 = broker.ps.memory_info().rss

                async def beat(bodies: list[bytes]) -> float:
                    c0 = sum(broker.ps.cpu_times()[:2])
                    replies = await asyncio.gather(*(c.invoke(broker.addr, make_request(RequestCode.HEART_BEAT, {}, b),
                                                              60) for c, b in zip(clients, bodies, strict=True)))
                    bad = [r for r in replies if r.code != ResponseCode.SUCCESS]
                    if bad:
                        raise RuntimeError(f"heartbeat refused: {bad[0].code} {bad[0].remark}")
                    return (sum(broker.ps.cpu_times()[:2]) - c0) / n * 1e6

                producer = [HeartbeatData(f"127.0.0.1@p{i}", ("scale_pg",)).encode() for i in range(n)]
                await beat(producer)  # the first: each connection and client registered
                await asyncio.sleep(1)
                rss1 = broker.ps.memory_info().rss
                producer_us = min([await beat(producer) for _ in range(3)])
                subs = (SubscriptionData("ScaleConn", "*"),)
                consumer = (ConsumerData("scale_conn_cg", subscriptions=subs),)
                full = [HeartbeatData(f"127.0.0.1@p{i}", ("scale_pg",), consumer) for i in range(n)]
                fp = full[0].compute_fingerprint()
                v1 = [h.encode() for h in full]
                v2_full = [HeartbeatData(h.client_id, h.producer_groups, h.consumers, fp).encode() for h in full]
                v2_only = [h.without_subscriptions(fp).encode() for h in full]
                await beat(v1)  # the group's members join
                await asyncio.sleep(1.5)  # the notices of the joins go out
                consumer_v1_us = min([await beat(v1) for _ in range(3)])
                await beat(v2_full)
                consumer_v2_us = min([await beat(v2_only) for _ in range(3)])
                return {"connections": n, "rss_idle_mib": round(rss0 / 2**20, 1),
                        "rss_with_mib": round(rss1 / 2**20, 1),
                        "kib_per_connection": round((rss1 - rss0) / n / 1024, 1),
                        "broker_cpu_us_per_producer_heartbeat": round(producer_us, 1),
                        "broker_cpu_us_per_consumer_heartbeat_full": round(consumer_v1_us, 1),
                        "broker_cpu_us_per_consumer_heartbeat_fingerprint": round(consumer_v2_us, 1),
                        "body_bytes_full": len(v1[0]), "body_bytes_fingerprint": len(v2_only[0])}
            finally:
                await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)

        log(f"connections: {n} idle connections and their heartbeats")
        report(bench="scale", row="connections", **asyncio.run(run()), loadavg_1m=round(os.getloadavg()[0], 2))
    finally:
        broker.stop()
        shutil.rmtree(wd, ignore_errors=True)


def _topics_bench(row: str) -> Callable[[argparse.Namespace], None]:
    """The rows kept in bench_scale_topics.py (topic creation through the admin client; one nameserver and many
    simulated brokers), run from here with this command's options."""
    def run(args: argparse.Namespace) -> None:
        import bench_scale_topics as t

        a = argparse.Namespace(topics=args.create_topics, step=args.create_step, queues=8, brokers=args.ns_brokers,
                               broker_topics=args.ns_broker_topics, rounds=args.ns_rounds)
        result = t.row_topics(a) if row == "create" else t.row_nameserver(a)
        report(bench="scale", **{**result, "row": row})
    return run


ROWS: dict[str, tuple[Callable[[argparse.Namespace], None], str]] = {
    "create": (_topics_bench("create"), "topics created one after another through the admin client (10,000)"),
    "nameserver": (_topics_bench("nameserver"), "one nameserver, many simulated brokers: CPU per round, route "
                                                "query cost and latency"),
    "topics": (row_topics, "batched sends over many topics vs one topic; consume-queue disk per written queue"),
    "queues": (row_queues, "many queues on one store: write one message each, restart time, RSS, crash restart"),
    "connections": (row_connections, "idle client connections: memory each, broker CPU per heartbeat (v1, v2)"),
    "consumers": (row_consumers, "one group of many push consumers: time to settle, failed heartbeats and "
                                 "rebalances, steady broker CPU"),
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
    ap.add_argument("--consumers", default="1000", help="consumers: group sizes, comma separated (50,200,500,1000)")
    ap.add_argument("--consumer-queues", type=int, default=64, help="consumers: queues of the topic")
    ap.add_argument("--consumer-procs", type=int, default=4, help="consumers: child processes holding the consumers")
    ap.add_argument("--settle-quiet", type=float, default=3.0,
                    help="consumers: seconds without an assignment change that count as settled")
    ap.add_argument("--settle-timeout", type=float, default=180.0, help="consumers: give up settling after this")
    ap.add_argument("--steady", type=float, default=10.0, help="consumers: seconds of steady broker CPU measured")
    ap.add_argument("--connections", type=int, default=2000,
                    help="connections: idle connections (the broker allows 2,048 per IP: maxConnectionsPerIp)")
    ap.add_argument("--create-topics", type=int, default=10_000, help="create: topics to create")
    ap.add_argument("--create-step", type=int, default=1_000, help="create: report every STEP topics")
    ap.add_argument("--ns-brokers", type=int, default=100, help="nameserver: simulated brokers")
    ap.add_argument("--ns-broker-topics", type=int, default=1_000, help="nameserver: topics per broker")
    ap.add_argument("--ns-rounds", type=int, default=3, help="nameserver: periodic rounds measured")
    args = ap.parse_args()
    if args.list:
        for name, (_, what) in ROWS.items():
            print(f"{name:12} {what}")
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
