"""`cometmq controller --peers`: the peers list, the etcd member's command line, and bad input refused before
anything starts."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from cometmq.controller.etcd_member import PeersError, etcd_args, parse_peers


def test_peers_parse_into_controller_and_etcd_addresses() -> None:
    peers = parse_peers("c0=127.0.0.1:9878, c1=127.0.0.1:9888,c2=127.0.0.2:9878")
    assert [(p.name, p.address) for p in peers] == [("c0", "127.0.0.1:9878"), ("c1", "127.0.0.1:9888"),
                                                     ("c2", "127.0.0.2:9878")]
    assert (peers[0].peer_url, peers[0].client_endpoint) == ("http://127.0.0.1:9879", "127.0.0.1:9880")
    args = etcd_args("etcd", "c0", peers[0].peer_url, "http://127.0.0.1:9880",
                     [(p.name, p.peer_url) for p in peers], Path("/d"), token="g")
    assert args[args.index("--initial-cluster") + 1] == \
        "c0=http://127.0.0.1:9879,c1=http://127.0.0.1:9889,c2=http://127.0.0.2:9879"
    assert args[args.index("--data-dir") + 1] == "/d"


@pytest.mark.parametrize("text, why", [
    ("c0=127.0.0.1:9878,c1=127.0.0.1:9888", "1, 3 or 5 nodes"),
    ("c0=127.0.0.1:9878,c0=127.0.0.1:9888,c2=127.0.0.1:9898", "distinct"),
    ("c0=127.0.0.1:9878,c1=127.0.0.1:9878,c2=127.0.0.1:9898", "distinct"),
    ("c0=127.0.0.1,c1=127.0.0.1:9888,c2=127.0.0.1:9898", "NAME=HOST:PORT"),
    ("127.0.0.1:9878", "NAME=HOST:PORT"),
    ("c0=h:65535", "NAME=HOST:PORT"),
])
def test_bad_peers_are_refused(text: str, why: str) -> None:
    with pytest.raises(PeersError, match=why):
        parse_peers(text)


@pytest.mark.parametrize("extra, why", [
    (["--peers", "c0=127.0.0.1:9878,c1=127.0.0.1:9888,c2=127.0.0.1:9898", "--node", "c9"], "--node must name"),
    (["--peers", "c0=127.0.0.1:9878,c1=127.0.0.1:9888,c2=127.0.0.1:9898", "--node", "c1"], "differs"),
    (["--peers", "c0=127.0.0.1:9878", "--node", "c0", "--etcd-endpoints", "127.0.0.1:2379"], "not both"),
])
def test_the_command_refuses_bad_peers_and_starts_nothing(tmp_path: Path, extra: list[str], why: str) -> None:
    out = subprocess.run([sys.executable, "-m", "cometmq.cli", "controller", "--data", str(tmp_path / "c"),
                          "--port", "9878", *extra], capture_output=True, text=True, timeout=60,
                         env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 2 and why in out.stderr
    assert not (tmp_path / "c").exists()


async def test_a_member_that_cannot_bind_its_port_is_reported(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The etcd member exits when its client port is taken (as when another process got it first); the controller
    logs that once, naming the member's log, instead of running on silently with one vote fewer."""
    import shutil
    import socket

    from cometmq.controller.etcd_member import EtcdMember
    from tests.kit.ports import free_port_block

    if shutil.which("etcd") is None:
        pytest.skip("etcd-server is not installed (scripts/test installs it)")
    base = free_port_block(1, (0, 1, 2))
    [me] = parse_peers(f"c0=127.0.0.1:{base}")
    member = EtcdMember(me, [me], tmp_path, token="t")
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
        squatter.bind(("127.0.0.1", base + 2))
        squatter.listen()
        member.start()
        try:
            await asyncio.wait_for(member.watch(interval=0.05), 30)
        finally:
            member.stop()
    assert member.proc is not None and member.proc.returncode not in (None, 0)
    [record] = [r for r in caplog.records if "etcd member exited" in r.getMessage()]
    assert str(tmp_path / "etcd.log") in record.getMessage()
