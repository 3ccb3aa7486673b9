"""A real etcd cluster for tests: N members as subprocesses on free loopback ports, each in its own data folder.

``async with EtcdCluster(tmp_path, size=3) as etcd:`` starts the members, waits until every one answers a
linearizable read (the cluster has a leader), and stops them all at the end. ``kill(i)`` SIGKILLs member ``i``
(its PID only), ``stop(i)`` terminates it, ``restart(i)`` starts it again on the same ports and data folder.
Short raft timings (heartbeat 100 ms, election 1 s) keep failovers quick. Skips the test when ``etcd`` is not on
PATH (Debian: ``apt-get install etcd-server``).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
from pathlib import Path
from types import TracebackType

import pytest

from cometmq.controller.etcd_member import etcd_args
from tests.kit.ports import free_port

HEARTBEAT_MS = 100
ELECTION_MS = 1000


class EtcdMember:
    def __init__(self, name: str, data_dir: Path, client_port: int, peer_port: int) -> None:
        self.name = name
        self.data_dir = data_dir
        self.client_port = client_port
        self.peer_port = peer_port
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.running:
            assert self.proc is not None
            os.kill(self.proc.pid, sig)


class EtcdCluster:
    def __init__(self, base: Path, size: int = 3, *, token: str = "cometmq-test", start_timeout: float = 20) -> None:
        self.etcd = shutil.which("etcd")
        self.etcdctl = shutil.which("etcdctl")
        if self.etcd is None or self.etcdctl is None:
            pytest.skip("etcd is not installed (apt-get install etcd-server)")
        self.base = base
        self.token = token
        self.start_timeout = start_timeout
        self.members = [EtcdMember(f"m{i}", base / f"etcd-m{i}", free_port(), free_port()) for i in range(size)]

    @property
    def endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members]

    def _args(self, m: EtcdMember) -> list[str]:
        assert self.etcd is not None
        return etcd_args(self.etcd, m.name, f"http://127.0.0.1:{m.peer_port}", f"http://127.0.0.1:{m.client_port}",
                         [(o.name, f"http://127.0.0.1:{o.peer_port}") for o in self.members], m.data_dir,
                         token=self.token, heartbeat_ms=HEARTBEAT_MS, election_ms=ELECTION_MS)

    def _spawn(self, m: EtcdMember) -> None:
        m.data_dir.mkdir(parents=True, exist_ok=True)
        with open(m.data_dir.parent / f"{m.name}.log", "ab") as out:
            m.proc = subprocess.Popen(self._args(m), stdout=out, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL)

    async def healthy(self, i: int) -> bool:
        """Member ``i`` serves a linearizable read (it is in a cluster with a leader)."""
        assert self.etcdctl is not None
        proc = await asyncio.create_subprocess_exec(
            self.etcdctl, "--endpoints", self.members[i].endpoint, "--command-timeout=1s", "endpoint", "health",
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            env={**os.environ, "ETCDCTL_API": "3"})
        return await proc.wait() == 0

    async def wait_healthy(self, *members: int, timeout: float | None = None) -> None:
        idx = list(members) or [i for i, m in enumerate(self.members) if m.running]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (timeout or self.start_timeout)
        for i in idx:
            while not await self.healthy(i):
                if not self.members[i].running:
                    raise AssertionError(f"etcd member {i} exited: see {self.base / (self.members[i].name + '.log')}")
                if loop.time() > deadline:
                    raise AssertionError(f"etcd member {i} not healthy after {timeout or self.start_timeout}s")
                await asyncio.sleep(0.1)

    async def start(self) -> None:
        for m in self.members:
            self._spawn(m)
        await self.wait_healthy()

    async def _reap(self, m: EtcdMember, timeout: float = 10) -> None:
        if m.proc is not None:
            try:
                await asyncio.to_thread(m.proc.wait, timeout)
            except subprocess.TimeoutExpired:
                m.signal(signal.SIGKILL)
                await asyncio.to_thread(m.proc.wait, timeout)

    async def kill(self, i: int) -> None:
        """SIGKILL member ``i`` and reap it."""
        m = self.members[i]
        m.signal(signal.SIGKILL)
        await self._reap(m)

    async def stop(self, i: int) -> None:
        m = self.members[i]
        m.signal(signal.SIGTERM)
        await self._reap(m)

    async def restart(self, i: int, *, wait: bool = True) -> None:
        """Start member ``i`` again on its ports and data folder (after ``kill`` or ``stop``)."""
        m = self.members[i]
        assert not m.running, f"etcd member {i} is running"
        self._spawn(m)
        if wait:
            await self.wait_healthy(i)

    async def close(self) -> None:
        """Kill every member: their data folders are thrown away (a graceful stop takes seconds per member)."""
        for m in self.members:
            m.signal(signal.SIGKILL)
        for m in self.members:
            await self._reap(m)

    async def __aenter__(self) -> EtcdCluster:
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()
