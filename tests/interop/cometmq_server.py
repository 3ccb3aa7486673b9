"""A real ``cometmq serve`` (nameserver + broker in one process) in a subprocess, for interop tests.

:class:`CometServer` picks two free 127.0.0.1 ports once, starts ``python -m cometmq.cli serve`` with a
temporary data folder and a broker.conf written from ``conf``, and waits for the ``cometmq serving`` line.
``stop()`` sends SIGTERM (a clean shutdown), ``kill()`` SIGKILL; ``start()`` again reuses the same ports and
data folder, so clients that cached the addresses reconnect to the restarted server.  Only the PID this
object started is ever signalled.

Small admin helpers (topic creation, route and consumer-list look-ups, runtime info) talk to the server
with cometmq's own remoting client so tests need not wait for the C++ client's 30 s route refresh.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cometmq.net.client import RemotingClient
from cometmq.net.tls import client_context
from cometmq.protocol.codes import RequestCode
from cometmq.protocol.remoting import RemotingCommand, make_request
from tests.kit import wait_until
from tests.kit.ports import free_port

SERVING_MARKER = "cometmq serving"

#: broker.conf for interop tests: short delay levels, a low retry limit, small files.
DEFAULT_CONF: dict[str, str] = {
    "messageDelayLevel": "1s 2s 3s",
    "maxReconsumeTimes": "2",
    "flushConsumerOffsetInterval": "500",
    "mappedFileSizeCommitLog": str(16 << 20),
    "mappedFileSizeConsumeQueue": str(20 * 20_000),
    "maxHashSlotNum": "4096",
    "maxIndexNum": "16384",
}


class ServerError(RuntimeError):
    pass


class CometServer:
    def __init__(self, workdir: Path, conf: Mapping[str, str] | None = None, *, python: str | None = None,
                 env: Mapping[str, str] | None = None) -> None:
        self.workdir = workdir
        self.data_dir = workdir / "data"
        self.home = workdir / "home"
        self.conf = {**DEFAULT_CONF, **(conf or {})}
        self.python = python or sys.executable
        self.namesrv_port = free_port()
        self.broker_port = free_port()
        while self.broker_port == self.namesrv_port:
            self.broker_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.log_path: Path | None = None
        #: the admin helpers connect with TLS, trusting this CA, when set (a server with tls.server.mode=enforcing)
        self.tls_ca: Path | None = None
        self._env = dict(os.environ if env is None else env)
        # No gRPC endpoint unless a test asks for one (COMETMQ_GRPC_PORT in env): parallel servers must not all
        # compete for the default port 8081.
        self._env.setdefault("COMETMQ_GRPC_PORT", "0")
        workdir.mkdir(parents=True, exist_ok=True)
        self.home.mkdir(exist_ok=True)
        self.conf_path = workdir / "broker.conf"
        self.conf_path.write_text("".join(f"{k}={v}\n" for k, v in self.conf.items()), encoding="utf-8")

    # -- addresses ------------------------------------------------------------------------------------------
    @property
    def namesrv(self) -> str:
        return f"127.0.0.1:{self.namesrv_port}"

    @property
    def broker_addr(self) -> str:
        return f"127.0.0.1:{self.broker_port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # -- lifecycle ------------------------------------------------------------------------------------------
    def start(self, timeout: float = 20.0) -> None:
        """Start and wait for the ``cometmq serving`` line.  On the first start only, ports another
        process grabbed since they were picked are replaced (a restart must keep its ports)."""
        for attempt in range(3):
            try:
                self._start_once(timeout)
                return
            except ServerError as exc:
                if self.starts > 1 or attempt == 2 or "address already in use" not in str(exc):
                    raise
                self.starts = 0
                self.namesrv_port, self.broker_port = free_port(), free_port()

    def _start_once(self, timeout: float) -> None:
        if self.running:
            raise ServerError("already running")
        self.starts += 1
        self.log_path = self.workdir / f"serve-{self.starts}.log"
        env = {**self._env, "HOME": str(self.home), "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"}
        cmd = [self.python, "-m", "cometmq.cli", "serve", "--data", str(self.data_dir),
               "--namesrv-port", str(self.namesrv_port), "--broker-port", str(self.broker_port),
               "-c", str(self.conf_path), "--log-level", "INFO"]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.workdir)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if SERVING_MARKER in self.log_text():
                return
            if self.proc.poll() is not None:
                raise ServerError(f"cometmq serve exited with rc {self.proc.returncode}:\n{self.log_tail()}")
            time.sleep(0.05)
        self.kill()
        raise ServerError(f"cometmq serve did not print {SERVING_MARKER!r} in {timeout}s:\n{self.log_tail()}")

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM and wait (a clean shutdown); SIGKILL and raise if it does not exit in time."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return proc.returncode if proc is not None else None
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise ServerError(f"cometmq serve ignored SIGTERM for {timeout}s:\n{self.log_tail()}") from None

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs (a crash)."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def restart(self, *, hard: bool = False) -> None:
        """Stop (SIGTERM, or SIGKILL if ``hard``) and start again on the same ports and data folder."""
        if hard:
            self.kill()
        else:
            rc = self.stop()
            if rc != 0:
                raise ServerError(f"cometmq serve exited with rc {rc} on SIGTERM:\n{self.log_tail()}")
        self.start()

    def close(self) -> None:
        try:
            self.stop()
        finally:
            self.kill()

    # -- logs -----------------------------------------------------------------------------------------------
    def log_text(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_text()[-chars:]

    def all_logs(self) -> str:
        return "".join(p.read_text(encoding="utf-8", errors="replace")
                       for p in sorted(self.workdir.glob("serve-*.log")))

    # -- admin requests ---------------------------------------------------------------------------------------
    def request(self, addr: str, code: int, ext: Mapping[str, object] | None = None, body: bytes = b"",
                timeout: float = 5.0) -> RemotingCommand:
        async def go() -> RemotingCommand:
            tls = None if self.tls_ca is None else client_context(ca_file=str(self.tls_ca))
            async with RemotingClient(ssl=tls) as client:
                return await client.invoke(addr, make_request(code, ext or {}, body), timeout=timeout)

        return asyncio.run(go())

    def route(self, topic: str) -> dict[str, Any] | None:
        """The nameserver's TopicRouteData for ``topic`` (None when it has none)."""
        r = self.request(self.namesrv, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
        if r.code != 0 or not r.body:
            return None
        data: dict[str, Any] = json.loads(r.body)
        return data

    def admin(self, *args: str) -> str:
        """``cometmq admin ARGS -n NAMESRV`` as an operator runs it; its stdout (ServerError when it fails)."""
        tls = [] if self.tls_ca is None else ["--tls", "--tls-ca", str(self.tls_ca)]
        out = subprocess.run([sys.executable, "-m", "cometmq.cli", "admin", *tls, *args, "-n", self.namesrv],
                             capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"})
        if out.returncode != 0:
            raise ServerError(f"cometmq admin {' '.join(args)}: {out.stderr.strip() or out.stdout.strip()}")
        return out.stdout

    def create_topic(self, topic: str, queues: int = 4, timeout: float = 10.0) -> None:
        """Create ``topic`` with the admin CLI (updateTopic) and wait until the nameserver routes it (so a consumer
        started now finds it at once instead of at its next 30 s route refresh)."""
        self.admin("updateTopic", "-b", self.broker_addr, "-t", topic, "-r", str(queues), "-w", str(queues))
        wait_until(lambda: self.route(topic) is not None, timeout, f"route of {topic}")

    #: subscription group settings this harness sets, as updateSubGroup's options
    _GROUP_OPTIONS = {"consumeMessageOrderly": "-o", "retryMaxTimes": "-r", "consumeBroadcastEnable": "-d",
                      "consumeFromMinEnable": "-m", "retryQueueNums": "-q"}

    def create_group(self, group: str, **config: object) -> None:
        """Create or update a subscription group with the admin CLI (updateSubGroup), e.g. an orderly one."""
        args = ["updateSubGroup", "-b", self.broker_addr, "-g", group]
        for key, value in config.items():
            if key not in self._GROUP_OPTIONS:
                raise ValueError(f"create_group: {key} is not one of {sorted(self._GROUP_OPTIONS)}")
            args += [self._GROUP_OPTIONS[key], str(value).lower() if isinstance(value, bool) else str(value)]
        self.admin(*args)

    def consumer_ids(self, group: str) -> list[str]:
        r = self.request(self.broker_addr, RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})
        if r.code != 0 or not r.body:
            return []
        ids: list[str] = json.loads(r.body)["consumerIdList"]
        return ids

    def runtime_info(self) -> dict[str, str]:
        r = self.request(self.broker_addr, RequestCode.GET_BROKER_RUNTIME_INFO)
        table: dict[str, str] = json.loads(r.body)["table"]
        return table

    def held_pulls(self) -> int:
        return int(self.runtime_info()["heldPullRequests"])

    def consumer_offsets(self, group: str, topic: str) -> dict[int, int]:
        """Committed offsets per queue (GET_CONSUME_STATS)."""
        r = self.request(self.broker_addr, RequestCode.GET_CONSUME_STATS, {"consumerGroup": group, "topic": topic})
        if r.code != 0:
            raise ServerError(f"consume stats {group}/{topic}: code {r.code} {r.remark}")
        from cometmq.protocol.admin_bodies import ConsumeStats

        return {q.queue_id: w.consumer_offset for q, w in ConsumeStats.decode(r.body).offset_table.items()}
