"""The Prometheus endpoint (metricsExporterType=PROM): counts scraped from /metrics during a produce/consume run match
what was sent, lag follows the committed offsets, and bad settings stop the start with a clear message."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cometmq.broker.config import BrokerConfig, broker_config_from_properties
from cometmq.broker.controller import BrokerController
from cometmq.client import LitePullConsumer, Message, MessageExt, Producer
from cometmq.namesrv.server import NamesrvConfig, NamesrvController
from cometmq.store.config import ConfigError

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from cometmq.metrics import MetricsExporter, start_exporter  # noqa: E402

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@dataclass
class Setup:
    namesrv: NamesrvController
    broker: BrokerController
    exporter: MetricsExporter

    @property
    def namesrv_addr(self) -> str:
        return f"127.0.0.1:{self.namesrv.port}"


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[Setup]:
    ns = NamesrvController(NamesrvConfig(port=0))
    await ns.start()
    cfg = BrokerConfig(listen_port=0, namesrv_addr=f"127.0.0.1:{ns.port}", metrics_exporter_type="PROM",
                       metrics_prometheus_port=0)
    cfg = cfg.replace(store=cfg.store.replace(store_path=tmp_path / "broker", commitlog_segment_size=8 << 20,
                                              consume_queue_units_per_file=10_000, max_hash_slot_num=4096,
                                              max_index_num=65536))
    broker = BrokerController(cfg)
    await broker.start()
    exporter = await start_exporter(broker, "127.0.0.1", 0)
    yield Setup(ns, broker, exporter)
    await exporter.stop()
    await broker.stop()
    await ns.stop()


async def http_get(port: int, path: str = "/metrics") -> tuple[int, str, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    raw = await reader.read()
    writer.close()
    head, _, body = raw.decode().partition("\r\n\r\n")
    status = int(head.split(" ", 2)[1])
    ctype = next((line.split(":", 1)[1].strip() for line in head.split("\r\n") if line.lower().startswith(
        "content-type:")), "")
    return status, ctype, body


async def scrape(port: int) -> Samples:
    status, ctype, body = await http_get(port)
    assert status == 200 and ctype.startswith("text/plain")
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(body) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples named ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    found = [v for (n, ls), v in samples.items() if n == name and want <= ls]
    assert found, f"no {name} with {labels}"
    return sum(found)


def record_size(broker: BrokerController, m: MessageExt) -> int:
    view = broker.store.read_record(m.commit_log_offset)
    assert view is not None
    return len(view)


async def test_counts_lag_and_labels_match_a_produce_consume_run(setup: Setup) -> None:
    broker, port = setup.broker, setup.exporter.port
    topic, group, n = "MetricsTopic", "metrics-cg", 300
    bodies = [f"message-{i}-".encode() * (1 + i % 7) for i in range(n)]
    async with Producer("metrics-pg", namesrv=setup.namesrv_addr) as p:
        for i in range(0, 200, 50):  # batches ...
            await p.send_batch([Message(topic, b) for b in bodies[i:i + 50]])
        for b in bodies[200:]:  # ... and single sends
            await p.send(Message(topic, b))

        got: list[MessageExt] = []
        async with LitePullConsumer(group, namesrv=setup.namesrv_addr, consume_from="first",
                                    auto_commit=False) as c:
            await c.subscribe(topic)
            while len(got) < n:
                got += await c.poll(1.0)
            # Mid-run (consumed, nothing committed yet): the whole topic is in flight at the consumer.
            mid = await scrape(port)
            assert value(mid, "rocketmq_consumer_inflight_messages", consumer_group=group, topic=topic) == n
            assert value(mid, "rocketmq_consumer_lag_messages", consumer_group=group, topic=topic) == n
            assert value(mid, "rocketmq_consumer_ready_messages", consumer_group=group, topic=topic) == 0
            assert value(mid, "rocketmq_consumer_connections", consumer_group=group, consume_mode="pull") == 1
            await c.commit()

        s = await scrape(port)
        common = {"cluster": "DefaultCluster", "node_type": "broker", "node_id": "broker-a"}
        sent_bytes = sum(record_size(broker, m) for m in got)
        assert sorted(m.body for m in got) == sorted(bodies)
        assert value(s, "rocketmq_messages_in_total", topic=topic, message_type="normal", is_system="false",
                     **common) == n
        assert value(s, "rocketmq_throughput_in_total", topic=topic) == sent_bytes  # stored record bytes
        assert sent_bytes > sum(map(len, bodies))
        assert value(s, "rocketmq_message_size_count", topic=topic) == 4 + 100  # one sample per send request
        assert value(s, "rocketmq_message_size_bucket", topic=topic, le="1024.0") == 104
        assert value(s, "rocketmq_messages_out_total", topic=topic, consumer_group=group, is_retry="false") == n
        assert value(s, "rocketmq_throughput_out_total", topic=topic, consumer_group=group) == sent_bytes
        assert value(s, "rocketmq_consumer_lag_messages", consumer_group=group, topic=topic) == 0
        assert value(s, "rocketmq_consumer_lag_latency", consumer_group=group, topic=topic) == 0
        assert value(s, "rocketmq_consumer_inflight_messages", consumer_group=group, topic=topic) == 0
        assert value(s, "rocketmq_rpc_latency_count", request_code="send_batch_message", response_code="success",
                     protocol_type="remoting") == 4
        assert value(s, "rocketmq_rpc_latency_count", request_code="send_message_v2") == 100
        assert value(s, "rocketmq_rpc_latency_count", request_code="pull_message") >= 1
        assert value(s, "rocketmq_storage_size") > 0
        assert value(s, "rocketmq_storage_flush_behind_bytes") >= 0
        assert value(s, "rocketmq_storage_dispatch_behind_bytes") == 0
        assert value(s, "cometmq_storage_unindexed_keys_total") == 0
        assert value(s, "cometmq_storage_unreadable_units_total") == 0
        assert value(s, "rocketmq_half_messages") == 0
        assert value(s, "cometmq_long_polling_holds", request_type="pull") >= 0

        k = 7
        for b in bodies[:k]:
            await p.send(Message(topic, b))
        s = await scrape(port)
        assert value(s, "rocketmq_messages_in_total", topic=topic) == n + k
        assert value(s, "rocketmq_consumer_lag_messages", consumer_group=group, topic=topic) == k
        assert value(s, "rocketmq_consumer_ready_messages", consumer_group=group, topic=topic) == k
        assert value(s, "rocketmq_consumer_lag_latency", consumer_group=group, topic=topic) >= 0


async def test_message_types_and_only_metrics_paths_answer(setup: Setup) -> None:
    async with Producer("types-pg", namesrv=setup.namesrv_addr) as p:
        await p.send_orderly(Message("TypesTopic", b"fifo"), sharding_key="k")
        await p.send(Message("TypesTopic", b"timer", delay=60))
    s = await scrape(setup.exporter.port)
    assert value(s, "rocketmq_messages_in_total", topic="TypesTopic", message_type="delay") == 1
    assert value(s, "rocketmq_messages_in_total", topic="TypesTopic", message_type="normal") == 1
    status, _, _ = await http_get(setup.exporter.port, "/nothing")
    assert status == 404


async def test_metrics_off_serves_nothing_but_counts_for_the_rates(tmp_path: Path) -> None:
    cfg = BrokerConfig(listen_port=0)
    broker = BrokerController(cfg.replace(store=cfg.store.replace(store_path=tmp_path / "b")))
    # the message counters stay: GET_BROKER_RUNTIME_INFO's TPS and VIEW_BROKER_STATS_DATA read them
    assert broker.send_processor.stats is broker.stats is broker.pull_processor.stats is broker.pop.stats
    await broker.start()
    try:
        assert broker.server is not None and broker.server._observer is None  # no RPC latency timing
    finally:
        await broker.stop()


@pytest.mark.parametrize(("props", "error"), [
    ({"metricsExporterType": "OTLP_GRPC"}, "cometmq has no OTLP or log exporter"),
    ({"metricsExporterType": "prometheus"}, "must be one of DISABLE, PROM"),
    ({"metricsPrometheusPort": "70000"}, "a port is 0..65535"),
    ({"metricsPromExporterPort": "x"}, "metricsPromExporterPort='x'"),
])
def test_bad_settings_are_refused(props: dict[str, str], error: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(error)):
        broker_config_from_properties(props)


def test_settings_are_read() -> None:
    cfg = broker_config_from_properties({"metricsExporterType": "prom", "metricsPrometheusPort": "5600",
                                         "metricsPromExporterHost": "127.0.0.2"})
    assert (cfg.metrics_exporter_type, cfg.metrics_prometheus_port, cfg.metrics_prometheus_host) == \
        ("PROM", 5600, "127.0.0.2")
    assert BrokerConfig().metrics_exporter_type == "DISABLE" and BrokerConfig().metrics_prometheus_port == 5557


def _serve(tmp_path: Path, conf: str) -> subprocess.Popen[str]:
    (tmp_path / "broker.conf").write_text(conf)
    return subprocess.Popen([sys.executable, "-m", "cometmq.cli", "serve", "--data", str(tmp_path / "data"),
                             "--namesrv-port", "0", "--broker-port", "0", "--grpc-port", "0",
                             "-c", str(tmp_path / "broker.conf")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


async def test_cometmq_serve_serves_metrics(tmp_path: Path) -> None:
    proc = _serve(tmp_path, "metricsExporterType=PROM\nmetricsPrometheusPort=0\n")
    try:
        assert proc.stdout is not None
        line = ""
        for line in proc.stdout:
            if line.startswith("cometmq serving"):
                break
        found = re.search(r"metrics http://127\.0\.0\.1:(\d+)/metrics", line)
        assert found, line
        s = await scrape(int(found.group(1)))
        assert value(s, "rocketmq_broker_permission", node_type="broker") == 6
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode == 0


def test_cometmq_serve_refuses_a_bad_exporter_type(tmp_path: Path) -> None:
    proc = _serve(tmp_path, "metricsExporterType=LOG\n")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "metricsExporterType='LOG'" in out and "cometmq has no OTLP or log exporter" in out, out


async def test_the_grafana_dashboard_reads_only_metrics_the_broker_exports(setup: Setup) -> None:
    import json

    dashboard = json.loads((Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {re.sub(r"_(total|bucket|count|sum)$", "", name)
            for e in exprs for name in re.findall(r"\b((?:rocketmq|cometmq)_\w+)", e)}
    _, _, text = await http_get(setup.exporter.port)
    exported = {re.sub(r"_total$", "", name) for name in re.findall(r"^# TYPE (\S+) ", text, re.M)}
    assert used and used <= exported, used - exported
    assert {"rocketmq_messages_in", "rocketmq_consumer_lag_messages", "rocketmq_rpc_latency",
            "rocketmq_storage_size"} <= used


async def test_request_codes_the_broker_does_not_serve_share_one_series(setup: Setup) -> None:
    """rocketmq_rpc_latency had a series for every request code a client sent, served or not: a client that sent
    codes at random grew the broker's memory and every scrape without bound. Codes the broker does not know are now
    one series, request_code="other"."""
    from cometmq.net.client import RemotingClient
    from cometmq.protocol.codes import ResponseCode
    from cometmq.protocol.remoting import make_request

    async with RemotingClient() as client:
        for code in range(50_000, 50_300):
            reply = await client.invoke(setup.broker.addr, make_request(code, {}))
            assert reply.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    s = await scrape(setup.exporter.port)
    codes = {dict(ls)["request_code"] for n, ls in s if n == "rocketmq_rpc_latency_count"}
    assert len(codes) < 20, sorted(codes)
    assert value(s, "rocketmq_rpc_latency_count", request_code="other",
                 response_code="request_code_not_supported") == 300


async def test_a_deleted_topic_leaves_no_series_and_the_totals_stay(setup: Setup) -> None:
    """The broker kept the counters of every topic it ever had: a workload that creates and deletes topics grew
    its memory and every scrape by a few series per topic, for good. A deleted topic's series now go with it (and
    a deleted group's), while the broker's totals (GET_BROKER_RUNTIME_INFO) still count its messages."""
    from cometmq.client import Admin

    topics, group = [f"ChurnTopic{i}" for i in range(5)], "churn-cg"
    async with Admin(namesrv=setup.namesrv_addr) as admin:
        for t in topics:
            await admin.create_topic(t, read_queues=1)
        async with Producer("churn-pg", namesrv=setup.namesrv_addr) as p:
            for t in topics:
                await p.send(Message(t, b"x"))
        async with LitePullConsumer(group, namesrv=setup.namesrv_addr, consume_from="first") as c:
            for t in topics:
                await c.subscribe(t)
            got: list[MessageExt] = []
            while len(got) < len(topics):
                got += await c.poll(1.0)
        before = await scrape(setup.exporter.port)
        assert value(before, "rocketmq_messages_in_total", topic=topics[0]) == 1
        assert value(before, "rocketmq_messages_out_total", topic=topics[0], consumer_group=group) == 1
        totals = await admin.broker_runtime_info(setup.broker.addr)
        for t in topics:
            await admin.delete_topic(t)
        await admin.delete_subscription_group(group)
        after = await scrape(setup.exporter.port)
        left = sorted({n for n, ls in after if dict(ls).get("topic") in topics or dict(ls).get("consumer_group")
                       == group})
        assert not left, left
        again = await admin.broker_runtime_info(setup.broker.addr)
        for key in ("msgPutTotalTodayNow", "msgGetTotalTodayNow"):
            assert int(again[key]) == int(totals[key]) >= len(topics)


async def _large_answer(setup: Setup) -> int:
    """Offsets of 10000 groups on the broker: their lag series, ~10 MB of text; the size of the answer."""
    from cometmq.client import Admin
    from cometmq.net.client import RemotingClient
    from cometmq.protocol.codes import RequestCode
    from cometmq.protocol.remoting import make_request

    async with Admin(namesrv=setup.namesrv_addr) as admin:
        await admin.create_topic("IdleReader", read_queues=1)
    async with RemotingClient() as client:
        for start in range(0, 10_000, 500):
            await asyncio.gather(*(client.invoke(setup.broker.addr, make_request(
                RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": f"idle-reader-cg-{i}", "topic": "IdleReader",
                                                     "queueId": 0, "commitOffset": 0}))
                for i in range(start, start + 500)))
    return len(setup.exporter.render())


async def test_a_scraper_that_does_not_read_is_let_go(setup: Setup) -> None:
    """The endpoint waited for a scraper to read the whole answer with no time limit: a client that asked for
    /metrics and never read held the answer (megabytes on a large broker) and its connection for good, and many
    such clients held as many. A scraper that has not read the answer within the time limit is now cut off."""
    import socket

    size = await _large_answer(setup)
    assert size > 8 << 20, size  # more than the kernel's buffers take
    setup.exporter.write_timeout = 1.0
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await loop.sock_connect(sock, ("127.0.0.1", setup.exporter.port))
        await loop.sock_sendall(sock, b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        await asyncio.sleep(3.0)  # not reading, past the time limit
        got = 0
        try:
            while chunk := await asyncio.wait_for(loop.sock_recv(sock, 1 << 20), 10.0):
                got += len(chunk)
        except ConnectionError:
            pass
        # cut off (EOF or a reset, not the 10 s wait): what arrived is what the kernel's buffers held, never all
        assert got < size
    finally:
        sock.close()


def _rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def test_scrapers_that_do_not_read_hold_a_bounded_number_of_answers(setup: Setup) -> None:
    """Each scrape was answered at once, however many were being written: clients that asked for /metrics on many
    connections and did not read each held a whole answer (megabytes on a large broker, for the write time limit),
    so 32 of them held ~32 answers of the broker's memory, and more would have run it out. At most
    ``MAX_ANSWERS`` answers are now written at once; a scrape waits for its turn (a 503 past the read time limit),
    and the memory held is that of those answers, whatever the number of connections."""
    import socket

    from cometmq.metrics.exporter import MAX_ANSWERS

    size = await _large_answer(setup)
    assert size > 8 << 20, size
    loop = asyncio.get_running_loop()
    socks = []
    base = _rss()
    try:
        for _ in range(32):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.setblocking(False)
            socks.append(sock)
            await loop.sock_connect(sock, ("127.0.0.1", setup.exporter.port))
            await loop.sock_sendall(sock, b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        await asyncio.sleep(1.5)  # every scrape had its time to be answered (a render takes ~0.25 s); none read
        held = _rss() - base

        async def answered_to(sock: socket.socket) -> bool:
            try:
                return len(await asyncio.wait_for(loop.sock_recv(sock, 64), 0.3)) > 0
            except TimeoutError:
                return False

        answered = await asyncio.gather(*(answered_to(sock) for sock in socks))
        assert sum(answered) <= MAX_ANSWERS, sum(answered)
        assert held < 4 * MAX_ANSWERS * size, (held >> 20, size >> 20)  # (~2 copies each; 32: ~330 MB)
    finally:
        for sock in socks:
            sock.close()
    # the connections gone, the turns are free again: a scrape is answered
    status, _, body = await asyncio.wait_for(http_get(setup.exporter.port), 30)
    assert status == 200 and len(body) > 8 << 20


def _without_storage_size(text: bytes) -> bytes:
    """The text less the rocketmq_storage_size sample (the file system's use, which anything on the machine moves)."""
    lines = text.split(b"\n")
    kept = [line for line in lines if not line.startswith(b"rocketmq_storage_size{")]
    assert len(kept) == len(lines) - 1
    return b"\n".join(kept)


async def test_the_text_is_prometheus_clients_byte_for_byte(tmp_path: Path) -> None:
    """The exposition is written directly (metrics/text.py) instead of by prometheus_client's generate_latest, which
    took ~1 s on the broker's loop with 10,000 consumer groups. It is the same text, byte for byte, as
    generate_latest writes for the same families: counters, gauges, both histograms, label values to escape (a
    cluster name with a quote, a backslash and a newline), numbers Go writes with an exponent (over 10**6)."""
    from prometheus_client import generate_latest
    from prometheus_client.registry import CollectorRegistry

    from cometmq.client import Admin
    from cometmq.metrics.collector import BrokerCollector

    ns = NamesrvController(NamesrvConfig(port=0))
    await ns.start()
    cfg = BrokerConfig(listen_port=0, namesrv_addr=f"127.0.0.1:{ns.port}", metrics_exporter_type="PROM",
                       metrics_prometheus_port=0, broker_cluster_name='Odd "cluster" \\ one\nline two')
    broker = BrokerController(cfg.replace(store=cfg.store.replace(store_path=tmp_path / "broker",
                                                                  commitlog_segment_size=8 << 20)))
    await broker.start()
    exporter = await start_exporter(broker, "127.0.0.1", 0)
    namesrv = f"127.0.0.1:{ns.port}"
    try:
        async with Admin(namesrv=namesrv) as admin:
            await admin.create_topic("TextTopic", read_queues=4, write_queues=4, cluster=cfg.broker_cluster_name)
        async with Producer("text-pg", namesrv=namesrv) as p:
            for _ in range(8):
                await p.send_batch([Message("TextTopic", b"x" * 4000) for _ in range(50)])  # 1.6 MB in
            await p.send(Message("TextTopic", b"later", delay=60))
        async with LitePullConsumer("text-cg", namesrv=namesrv, consume_from="first", auto_commit=False) as c:
            await c.subscribe("TextTopic")
            got: list[MessageExt] = []
            while len(got) < 400:
                got += await c.poll(1.0)
            await c.commit()
        for g in range(300):  # groups behind, some on queues they never committed
            broker.offsets.commit(f"text-cg-{g}", "TextTopic", g % 4, g)
        broker.clock = lambda: 1_900_000_000_000  # (the lag latencies are "now" less a store time)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(BrokerCollector(broker))
        reference = generate_latest(registry)
        assert b'cluster="Odd \\"cluster\\" \\\\ one\\nline two"' in reference
        assert b"rocketmq_throughput_in_total{" in reference and b"e+06\n" in reference
        assert b"rocketmq_message_size_bucket{" in reference and b"rocketmq_rpc_latency_sum{" in reference
        assert reference.count(b"\nrocketmq_consumer_lag_latency{") == 301
        text = exporter.render()
        assert _without_storage_size(text) == _without_storage_size(reference)
        _, _, body = await http_get(exporter.port)  # (sent in pieces)
        assert _without_storage_size(body.encode()) == _without_storage_size(reference)
    finally:
        await exporter.stop()
        await broker.stop()
        await ns.stop()


async def test_a_scrape_does_not_hold_the_brokers_loop(setup: Setup) -> None:
    """A scrape read the broker and wrote the whole text on the broker's loop: with 10,000 consumer groups (~50,000
    series, 10 MB) the loop served nothing for ~1 s at every scrape, and every client's requests waited. The numbers
    are now read on the loop in slices of a few milliseconds and the text is written in a thread, then sent piece
    by piece: the loop runs all along (bench/bench_metrics_render.py: the longest stall ~20 ms)."""
    size = await _large_answer(setup)
    assert size > 8 << 20, size
    loop = asyncio.get_running_loop()
    gaps: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        last = loop.time()
        while not done.is_set():
            await asyncio.sleep(0.001)
            gaps.append(loop.time() - last)
            last = loop.time()

    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0.05)
    gaps.clear()
    try:
        status, _, body = await http_get(setup.exporter.port)
    finally:
        done.set()
        await tick
    assert status == 200 and len(body) > 8 << 20
    assert max(gaps) < 0.3, f"the loop stood still {max(gaps):.3f} s during a scrape"


def test_numbers_are_written_as_prometheus_client_writes_them() -> None:
    """text.number takes a shortcut for ints; at its edges it must write what prometheus_client writes (Python's
    float repr turns to an exponent from 10**16: '-1e+16', not '-10000000000000000.0')."""
    from prometheus_client.utils import floatToGoString

    from cometmq.metrics.text import number

    values: list[float] = [0, 1, -1, 999_999, 1_000_000, 10**15, -10**15, -10**15 - 1, -10**16, -10**17 - 3, 2**63,
                           0.5, -2.25, 1e-9, float("inf"), float("-inf"), 123456789.125]
    assert [number(v) for v in values] == [floatToGoString(v) for v in values]  # type: ignore[no-untyped-call]
