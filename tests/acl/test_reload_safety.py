"""The ACL file's hot reload never puts a half-written file in force: an editor or ``cp`` that writes plain_acl.yml
in place can leave it truncated between two writes, and a truncated list of accounts still parses. A real
``cometmq serve`` subprocess with aclEnable=true; the file is rewritten in two steps with a pause in between."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import pytest

from cometmq.net.client import RemotingClient
from cometmq.protocol.acl import Credentials, sign_request
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.remoting import make_request
from tests.interop.cometmq_server import CometServer
from tests.kit import wait_until
from tests.kit.acl import admin_and_user

pytestmark = pytest.mark.timeout(90)

ADMIN = ("adminUser1", "adminSecret1")
USER = ("userAlpha1", "userSecret1")
LATER = ("userBravo1", "userBravo11")
#: the reload poll's period (cometmq.acl.control.DEFAULT_RELOAD_INTERVAL_S)
POLL_S = 3.0


def _with_account(text: str, account: tuple[str, str]) -> str:
    return text + f"  - accessKey: {account[0]}\n    secretKey: {account[1]}\n    admin: false\n"


def _answer(addr: str, creds: tuple[str, str]) -> tuple[int, str]:
    async def go() -> tuple[int, str]:
        async with RemotingClient() as client:
            cmd = sign_request(make_request(RequestCode.GET_BROKER_RUNTIME_INFO, {}), Credentials(*creds))
            r = await client.invoke(addr, cmd, timeout=5)
            return r.code, r.remark or ""

    return asyncio.run(go())


def _loads(server: CometServer) -> int:
    return len(re.findall(r"ACL loaded from", server.log_text()))


def test_a_file_written_in_two_steps_is_not_put_in_force_half_written(tmp_path: Path) -> None:
    acl = tmp_path / "plain_acl.yml"
    full = admin_and_user(ADMIN, USER)
    acl.write_text(full)
    server = CometServer(tmp_path / "serve", {
        "aclEnable": "true", "aclFile": str(acl),
        "innerClientAuthenticationCredentials": json.dumps({"accessKey": ADMIN[0], "secretKey": ADMIN[1]})})
    server.start()
    try:
        assert _answer(server.broker_addr, USER)[0] == ResponseCode.SUCCESS
        # learn when the reload polls run: a complete change is put in force at one of them
        before = _loads(server)
        acl.write_text(_with_account(full, LATER))
        wait_until(lambda: _loads(server) > before, 4 * POLL_S, "the first change put in force")
        polled_at = time.monotonic()
        assert _answer(server.broker_addr, LATER)[0] == ResponseCode.SUCCESS
        # rewrite the file in place, as `cp` or an editor saving in place does: truncated, the first account (a
        # file that parses: the user's account is not in it yet), a pause over the next poll, then the rest
        final = _with_account(full, LATER)
        cut = final.index(f"  - accessKey: {USER[0]}")
        time.sleep(0.3)
        refusals: list[str] = []
        with open(acl, "w", encoding="utf-8") as f:
            f.write(final[:cut])
            f.flush()
            while time.monotonic() < polled_at + POLL_S + 0.8:  # the next poll sees the half-written file
                code, remark = _answer(server.broker_addr, USER)
                if code != ResponseCode.SUCCESS:
                    refusals.append(remark)
                time.sleep(0.1)
            f.write(final[cut:])
        # the user keeps its access through the poll that saw the half-written file and the ones after
        while time.monotonic() < polled_at + 3 * POLL_S + 0.5:
            code, remark = _answer(server.broker_addr, USER)
            if code != ResponseCode.SUCCESS:
                refusals.append(remark)
            time.sleep(0.1)
        assert not refusals, (refusals[:3], server.log_tail())
        for creds in (ADMIN, USER, LATER):
            assert _answer(server.broker_addr, creds)[0] == ResponseCode.SUCCESS, creds
    finally:
        server.close()


async def test_an_acl_change_starts_from_the_file_only_once_it_stopped_changing(tmp_path: Path) -> None:
    """mqadmin updateAclConfig & co. re-read the file first (an operator may have edited it since the last poll):
    a file still being written is refused then, not read half-written and saved back."""
    from cometmq.acl import AccessControl, AclConfigError

    path = tmp_path / "plain_acl.yml"
    full = admin_and_user(ADMIN, USER)
    path.write_text(full)
    ac = AccessControl(path)
    ac.load()
    stop = asyncio.Event()

    async def keep_writing() -> None:
        n = 0
        with open(path, "w", encoding="utf-8") as f:
            f.write(full[:full.index(f"  - accessKey: {USER[0]}")])
            while not stop.is_set():
                n += 1
                f.write(f"# {n}\n")
                f.flush()
                await asyncio.sleep(0.01)
            f.write(_with_account(full, LATER)[full.index(f"  - accessKey: {USER[0]}"):])

    writer = asyncio.create_task(keep_writing())
    await asyncio.sleep(0.05)
    with pytest.raises(AclConfigError, match="still being written"):
        await ac.reload_settled(gap_s=0.05, reads=4)
    assert set(ac.config.accounts) == {ADMIN[0], USER[0]}
    stop.set()
    await writer
    await ac.reload_settled(gap_s=0.05)
    assert set(ac.config.accounts) == {ADMIN[0], USER[0], LATER[0]} and "# 1" in path.read_text()
    assert not ac.settling
