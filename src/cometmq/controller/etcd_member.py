"""An etcd member run beside a controller node (``cometmq controller --peers``): the consensus engine of a 3- or
5-node controller without a separately run etcd cluster.

Every controller node of ``--peers c0=host:port,c1=host:port,…`` runs one etcd member named after it, listening
for its peers on ``port + 1`` and for clients on ``port + 2`` (``port`` is the controller's remoting port), with its
data in the controller's data folder (``DIR/etcd``). The controllers' ``EtcdLog`` talks to every member's client
URL, so a node keeps working while its own member is down and a quorum is up. etcd fsyncs its WAL before an entry
counts (docs/controller.md). The member is a child process: stopped by PID with the controller, and sent SIGTERM by
the kernel if the controller dies first (Linux ``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

#: the etcd member's ports relative to its controller's remoting port
PEER_PORT_OFFSET = 1
CLIENT_PORT_OFFSET = 2


class PeersError(ValueError):
    """``--peers`` / ``--node`` do not describe a controller cluster."""


@dataclass(frozen=True, slots=True)
class Peer:
    name: str
    host: str
    port: int  # the controller's remoting port

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self.port + PEER_PORT_OFFSET}"

    @property
    def client_endpoint(self) -> str:
        return f"{self.host}:{self.port + CLIENT_PORT_OFFSET}"


def parse_peers(text: str) -> list[Peer]:
    """``c0=127.0.0.1:9878,c1=127.0.0.1:9888,c2=127.0.0.1:9898``: 1, 3 or 5 distinct names and addresses."""
    peers: list[Peer] = []
    for part in (p.strip() for p in text.split(",")):
        name, eq, addr = part.partition("=")
        host, colon, port = addr.rpartition(":")
        if not eq or not name or not colon or not host or not port.isdigit() or \
                not 1 <= int(port) <= 65535 - CLIENT_PORT_OFFSET:
            raise PeersError(f"{part!r} is not NAME=HOST:PORT")
        peers.append(Peer(name, host, int(port)))
    if len(peers) not in (1, 3, 5):
        raise PeersError(f"a controller cluster has 1, 3 or 5 nodes, not {len(peers)}")
    if len({p.name for p in peers}) != len(peers) or len({p.address for p in peers}) != len(peers):
        raise PeersError("peer names and addresses must be distinct")
    return peers


def etcd_args(etcd: str, name: str, peer_url: str, client_url: str, cluster: Sequence[tuple[str, str]],
              data_dir: Path, *, token: str, heartbeat_ms: int = 100, election_ms: int = 1000) -> list[str]:
    """The command line of member ``name`` of a new etcd cluster (``cluster``: every member's name and peer URL).
    A restart with the same data folder rejoins: etcd ignores the initial-cluster flags once its folder holds a
    member. Short raft timings: a lost etcd leader is replaced within about a second."""
    return [etcd, "--name", name, "--data-dir", str(data_dir),
            "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", ",".join(f"{n}={u}" for n, u in cluster), "--initial-cluster-token", token,
            "--initial-cluster-state", "new",
            "--heartbeat-interval", str(heartbeat_ms), "--election-timeout", str(election_ms),
            "--log-level", "warn", "--logger", "zap"]


def _die_with_parent() -> None:  # pragma: no cover - runs in the forked child
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class EtcdMember:
    """``me``'s etcd member as a child process; its output in ``DIR/etcd.log``."""

    def __init__(self, me: Peer, peers: Sequence[Peer], data: Path, *, token: str) -> None:
        etcd = shutil.which("etcd")
        if etcd is None:
            raise PeersError("--peers runs an etcd member beside each controller, and etcd is not installed "
                             "(Debian: apt-get install etcd-server)")
        self.data = data
        self.args = etcd_args(etcd, me.name, me.peer_url, f"http://{me.client_endpoint}",
                              [(p.name, p.peer_url) for p in peers], data / "etcd", token=token)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.data.mkdir(parents=True, exist_ok=True)
        with open(self.data / "etcd.log", "ab") as out:
            self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         preexec_fn=_die_with_parent if sys.platform == "linux" else None)

    async def watch(self, interval: float = 1.0) -> None:
        """Log an error once if this member exits while the controller runs: the controller goes on through the
        other members (it is given every endpoint), but the group has lost one vote of its quorum."""
        while self.proc is not None and self.proc.poll() is None:
            await asyncio.sleep(interval)
        if self.proc is not None:
            log.error("this controller's etcd member exited (code %s; its log: %s); the etcd cluster has one "
                      "member fewer until this controller is restarted", self.proc.returncode, self.data / "etcd.log")

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout)
