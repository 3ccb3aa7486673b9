"""``format("cometmq")`` beyond one local session: Spark Connect (a thin client), PySpark's declarative pipelines
(``spark-pipelines``), and a Spark standalone cluster.

One standalone cluster for the module: a master and a worker started from PySpark's ``spark-class``
on free loopback ports. A Spark Connect server (``spark-submit --class ...SparkConnectServer``) runs as an
application of that cluster, so everything sent through Connect runs in the worker's executor; a classic
``spark-submit`` application runs beside it. The Connect client is another process
(tests/spark/connect_client.py) in which ``import cometmq`` fails: only the server side has cometmq (its
Python finds ``pyspark_cometmq`` and registers the source; nothing is registered from the client).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

try:
    from pyspark.sql.connect.utils import check_dependencies

    check_dependencies()
except Exception as exc:  # PySparkImportError: the Connect client's packages are missing
    pytest.skip(f"the Spark Connect client needs pyspark[connect]'s packages "
                f"(pip install 'cometmq[spark]'): {exc}", allow_module_level=True)

from cometmq.client import Message
from cometmq.client.sync import SyncAdmin, SyncLitePullConsumer, SyncProducer
from tests.interop.cometmq_server import CometServer
from tests.kit.ports import free_port
from tests.spark.conftest import send
from tests.spark.sparkprocs import (
    BIN,
    ROOT,
    SparkProc,
    master_state,
    spark_env,
    start_connect_server,
    start_master,
    start_worker,
)

HERE = Path(__file__).resolve().parent
PIPELINE = ROOT / "examples" / "pipelines"

pytestmark = pytest.mark.timeout(300)  # the first test also waits for the cluster and the server to come up


@dataclass
class Cluster:
    master: str  # spark://127.0.0.1:PORT
    webui_port: int
    workdir: Path
    worker: SparkProc

    def wait_worker(self) -> None:
        self.worker.wait_for("Successfully registered with master")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp("spark-cluster")
    port, webui = free_port(), free_port()
    procs: list[SparkProc] = []
    try:
        master = start_master(workdir, port, webui)
        procs.append(master)
        master.wait_for("I have been elected leader")
        url = f"spark://127.0.0.1:{port}"
        # 4 cores (a count the master hands out, not CPUs): 2 for the Connect server, 2 for a classic app
        worker = start_worker(workdir, url, free_port(), free_port(), cores=4, memory="3g")
        procs.append(worker)
        yield Cluster(url, webui, workdir, worker)  # registered with the master: see wait_worker
    finally:
        for p in reversed(procs):
            p.stop()


@pytest.fixture(scope="module")
def connect(cluster: Cluster) -> Iterator[str]:
    """A Spark Connect server, an application of the standalone cluster; yields its ``sc://`` URL."""
    port = free_port()
    proc = start_connect_server(cluster.workdir, port, cluster.master,
                                {"spark.cores.max": "2", "spark.executor.memory": "768m"})
    try:  # the worker and the server start side by side
        cluster.wait_worker()
        proc.wait_for("Spark Connect server started at")
        yield f"sc://127.0.0.1:{port}"
    finally:
        proc.stop()


def client(url: str, scenario: str, *, with_cometmq: bool = False, **args: Any) -> dict[str, Any]:
    """Run tests/spark/connect_client.py: a separate Connect client process."""
    cmd = [sys.executable, str(HERE / "connect_client.py"), url, scenario, json.dumps(args)]
    if with_cometmq:
        cmd.append("--with-cometmq")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=spark_env(), cwd=HERE)
    results = [line[7:] for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    assert r.returncode == 0 and results, f"client {scenario} failed (rc {r.returncode}):\n{r.stderr[-4000:]}"
    out: dict[str, Any] = json.loads(results[-1])
    return out


def pull_all(namesrv: str, topic: str, expect: int, timeout: float = 30) -> list[tuple[str, str | None]]:
    """(body, tags) of every message of ``topic``, read with the SDK from offset 0 until ``expect`` arrived
    (and a moment more, so that a duplicate would show)."""
    with SyncAdmin(namesrv=namesrv) as admin:
        queues = list(admin.topic_stats(topic))
    got: list[tuple[str, str | None]] = []
    with SyncLitePullConsumer(f"{topic}-check", namesrv=namesrv, auto_commit=False, long_poll_timeout=0.5) as c:
        c.assign(queues)
        c.seek_to_beginning()
        deadline = time.monotonic() + timeout
        while len(got) < expect and time.monotonic() < deadline:
            got += [(m.body.decode(), m.tags) for m in c.poll(0.5)]
        got += [(m.body.decode(), m.tags) for m in c.poll(0.5)]
    return got


# -- Spark Connect --------------------------------------------------------------------------------------------


def test_connect_read(connect: str, server: CometServer, producer: SyncProducer, topic: str) -> None:
    send(producer, topic, [f"r{i}" for i in range(50)])
    out = client(connect, "read", namesrv=server.namesrv, topic=topic)
    assert not out["cometmq_imported"]
    assert sorted(body for _, _, body, _ in out["rows"]) == sorted(f"r{i}" for i in range(50))
    assert len({(q, o) for q, o, _, _ in out["rows"]}) == 50
    assert sum(out["per_queue"].values()) == 50 and len(out["per_queue"]) == 4


#: at-least-once through Connect: soak (~20-30 s each); CI runs the exactly-once ones (the same path, and the commit)
_MODES = [pytest.param(False, id="at-least-once", marks=pytest.mark.soak), pytest.param(True, id="exactly-once")]


@pytest.mark.parametrize("transactional", _MODES)
def test_connect_write(connect: str, server: CometServer, topic: str, transactional: bool) -> None:
    """A batch write from a thin client; exactly-once too (its tasks' halves committed by the driver, which runs
    in the Connect server, an application of the standalone cluster)."""
    out = client(connect, "write", namesrv=server.namesrv, topic=topic, n=120, transactional=transactional)
    assert out == {"written": 120, "cometmq_imported": False}
    got = pull_all(server.namesrv, topic, 120)
    assert sorted(got) == sorted((f"w{i}", f"t{i % 2}") for i in range(120))


@pytest.mark.parametrize("transactional", _MODES)
def test_connect_streaming(connect: str, server: CometServer, producer: SyncProducer, topic: str,
                           tmp_path: Path, transactional: bool) -> None:
    sink = topic + "Out"
    server.create_topic(sink, 4)
    send(producer, topic, [f"e{i}" for i in range(100)])
    out = client(connect, "stream", namesrv=server.namesrv, source=topic, sink=sink,
                 checkpoint=str(tmp_path / "ck"), more=30, transactional=transactional)
    assert out["error"] is None and out["rerun_error"] is None
    assert (out["first"], out["total"], out["rerun_rows"]) == (100, 130, 0)
    got = pull_all(server.namesrv, sink, 130)
    assert sorted(got) == sorted([(f"e{i}", "streamed") for i in range(100)]
                                 + [(f"late{i}", "streamed") for i in range(30)])


def test_connect_client_registration(connect: str, server: CometServer, producer: SyncProducer, topic: str) -> None:
    """``cometmq.spark.register`` from a client with cometmq installed works too (not needed: the server
    discovers the source); the class travels pickled by reference."""
    send(producer, topic, ["x"])
    out = client(connect, "register", with_cometmq=True, namesrv=server.namesrv, topic=topic)
    assert out["cometmq_imported"] and [r[2] for r in out["rows"]] == ["x"]


# -- declarative pipelines ------------------------------------------------------------------------------------


def run_pipeline(spec: Path, connect: str, cwd: Path) -> str:
    r = subprocess.run([str(BIN / "spark-pipelines"), "run", "--spec", str(spec), "--remote", connect],
                       capture_output=True, text=True, timeout=240, env=spark_env(), cwd=cwd)
    assert r.returncode == 0 and "Run is COMPLETED" in r.stdout, f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


def test_declarative_pipeline(connect: str, server: CometServer, producer: SyncProducer, topic: str,
                              tmp_path: Path) -> None:
    """examples/pipelines through ``spark-pipelines run``: the streaming table takes each reading once, the
    materialized view aggregates it."""
    yaml = pytest.importorskip("yaml", reason="spark-pipelines needs pyyaml (pip install 'cometmq[spark]')")
    base = int(time.time() * 1000)
    producer.send_batch([Message(topic, json.dumps({"sensor": f"s{i % 3}", "value": float(i), "ts": base + i})
                                 .encode()) for i in range(45)])
    producer.send_batch([Message(topic, b"not json")])  # no sensor: left out of the table
    project = tmp_path / "pipeline"
    shutil.copytree(PIPELINE, project, ignore=shutil.ignore_patterns("__pycache__"))
    spec = project / "spark-pipeline.yml"
    conf = yaml.safe_load(spec.read_text())
    conf["storage"] = (tmp_path / "storage").as_uri()
    conf["configuration"] = {"cometmq.namesrv": server.namesrv, "cometmq.topic": topic}
    spec.write_text(yaml.safe_dump(conf))

    r = subprocess.run([str(BIN / "spark-pipelines"), "run", "--spec", str(spec), "--remote", connect],
                       capture_output=True, text=True, timeout=240, env=spark_env(), cwd=tmp_path)
    assert r.returncode == 0 and "Run is COMPLETED" in r.stdout, f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"

    out = client(connect, "tables", tables=["readings", "sensor_stats"])
    readings = out["readings"]
    assert len(readings) == len({(r["queueId"], r["queueOffset"]) for r in readings}) == 45
    vals = {s: [float(i) for i in range(45) if i % 3 == int(s[1])] for s in ("s0", "s1", "s2")}
    assert {r["sensor"]: (r["readings"], r["avg_value"], r["max_value"]) for r in out["sensor_stats"]} == {
        s: (len(v), round(sum(v) / len(v), 3), max(v)) for s, v in vals.items()}


# -- a standalone cluster -------------------------------------------------------------------------------------


def test_connect_server_runs_on_the_cluster(connect: str, cluster: Cluster) -> None:
    """The tests above ran in the standalone worker's executor: the Connect server is an application of the
    master, holding cores of the one worker."""
    state = master_state(cluster.webui_port)
    assert [w["state"] for w in state["workers"]] == ["ALIVE"]
    apps = {a["name"]: a for a in state["activeapps"]}
    assert apps["cometmq-connect-tests"]["cores"] == 2, apps


@pytest.mark.soak  # another driver and executor JVM: ~30-60 s
def test_classic_app_on_the_cluster(cluster: Cluster, server: CometServer, producer: SyncProducer, topic: str,
                                    tmp_path: Path) -> None:
    """``spark-submit --master spark://...`` of a classic PySpark application: read a topic, write it to another,
    in the worker's executor (its Python workers are the executor's children, not the driver's)."""
    cluster.wait_worker()
    sink = topic + "Copy"
    server.create_topic(sink, 4)
    send(producer, topic, [f"c{i}" for i in range(80)])
    env = spark_env()
    cmd = [str(BIN / "spark-submit"), "--master", cluster.master, "--conf", "spark.ui.enabled=false",
           "--conf", "spark.cores.max=2", "--conf", "spark.executor.memory=768m",
           "--conf", "spark.driver.bindAddress=127.0.0.1", "--conf", "spark.driver.host=127.0.0.1",
           "--conf", f"spark.executorEnv.PYTHONPATH={env['PYTHONPATH']}",
           "--conf", f"spark.pyspark.python={sys.executable}",
           str(HERE / "cluster_job.py"), server.namesrv, topic, sink]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    results = [line[7:] for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    assert r.returncode == 0 and results, r.stderr[-4000:]
    out = json.loads(results[-1])
    assert out["read"] == 80 and out["master"] == cluster.master
    assert out["driver_pid"] not in out["worker_parents"]
    got = pull_all(server.namesrv, sink, 80)
    assert sorted(got) == sorted((f"c{i}", "copied") for i in range(80))
