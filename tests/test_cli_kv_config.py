"""Where the nameserver's KV configs (ORDER_TOPIC_CONFIG, written by ``updateTopic -o true``) are kept: ``cometmq
serve`` keeps them in its data folder, wherever that is chosen (``--data`` or the broker.conf's
storePathRootDir), whatever directory it is started from; ``cometmq namesrv`` where its ``kvConfigPath`` says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import cometmq
from cometmq.client.sync import SyncAdmin
from cometmq.namesrv.kv_config import ORDER_TOPIC_CONFIG
from tests.kit.ports import free_port
from tests.kit.procs import reap

#: the cometmq under test, whatever directory a server is started from
SOURCES = os.pathsep.join([str(Path(cometmq.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])


@contextmanager
def started(cwd: Path, *args: str) -> Iterator[subprocess.Popen[str]]:
    """A ``cometmq`` server command run from ``cwd``, once it says it serves; stopped (SIGTERM) when the block
    ends."""
    proc = subprocess.Popen([sys.executable, "-m", "cometmq.cli", *args], cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": SOURCES})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "listening on" in line or "cometmq serving" in line, (line, proc.stderr and proc.stderr.read())
        yield proc
        proc.terminate()
        assert proc.wait(30) == 0
    finally:
        reap(proc)


def admin(namesrv: str, *args: str) -> object:
    out = subprocess.run([sys.executable, "-m", "cometmq.cli", "admin", *args, "-n", namesrv, "--json"],
                         capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_serve_keeps_kv_configs_in_the_store_root_of_its_config_file(tmp_path: Path) -> None:
    store = tmp_path / "store"
    conf = tmp_path / "broker.conf"
    conf.write_text(f"storePathRootDir={store}\n")
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    there.mkdir()
    ns, bp = free_port(), free_port()
    serve = ("serve", "-c", str(conf), "--namesrv-port", str(ns), "--broker-port", str(bp), "--grpc-port", "0")
    namesrv = f"127.0.0.1:{ns}"
    with started(here, *serve):
        made = admin(namesrv, "updateTopic", "-c", "DefaultCluster", "-t", "KVT", "-r", "4", "-w", "4", "-o", "true")
        assert made["orderConf"] == "broker-a:4"  # type: ignore[index]
    kv = store / "namesrv" / "kvConfig.json"
    assert json.loads(kv.read_text()) == {"configTable": {ORDER_TOPIC_CONFIG: {"KVT": "broker-a:4"}}}
    with started(there, *serve):  # another directory, the same config file: the same KV configs
        route = admin(namesrv, "topicRoute", "-t", "KVT")
        assert route["orderTopicConf"] == "broker-a:4"  # type: ignore[index]
    assert not (here / "data").exists() and not (there / "data").exists()


def test_two_servers_started_from_one_directory_keep_their_own_kv_configs(tmp_path: Path) -> None:
    for name in ("a", "b"):
        data = tmp_path / name
        conf = tmp_path / f"{name}.conf"
        conf.write_text(f"storePathRootDir={data}\n")
        ns, bp = free_port(), free_port()
        with started(tmp_path, "serve", "-c", str(conf), "--namesrv-port", str(ns), "--broker-port", str(bp),
                     "--grpc-port", "0"), SyncAdmin(namesrv=f"127.0.0.1:{ns}") as a:
            assert a.get_kv_config(ORDER_TOPIC_CONFIG, "T") is None  # not the other server's
            a.put_kv_config(ORDER_TOPIC_CONFIG, "T", f"broker-{name}:1")
        assert json.loads((data / "namesrv" / "kvConfig.json").read_text()) == \
            {"configTable": {ORDER_TOPIC_CONFIG: {"T": f"broker-{name}:1"}}}
    assert not (tmp_path / "data").exists()


def test_namesrv_keeps_kv_configs_where_its_kv_config_path_says(tmp_path: Path) -> None:
    kv = tmp_path / "kv" / "kvConfig.json"
    conf = tmp_path / "namesrv.properties"
    ns = free_port()
    conf.write_text(f"listenPort={ns}\nkvConfigPath={kv}\n")
    for cwd, value in ((tmp_path, "broker-a:2"), (tmp_path / "kv", None)):
        with started(cwd, "namesrv", "-c", str(conf)), SyncAdmin(namesrv=f"127.0.0.1:{ns}") as a:
            if value is not None:
                a.put_kv_config(ORDER_TOPIC_CONFIG, "NT", value)
            assert a.get_kv_config(ORDER_TOPIC_CONFIG, "NT") == "broker-a:2"
    assert json.loads(kv.read_text()) == {"configTable": {ORDER_TOPIC_CONFIG: {"NT": "broker-a:2"}}}
