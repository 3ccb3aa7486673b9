"""DNS rebinding: a dashboard without a login answers only to IP addresses, localhost and the host names it is
told. A page of any site can point its own name at the dashboard's address; the browser then sends that page's
requests, Origin and Host alike, to the dashboard as same-origin ones. Plain HTTP requests with a Host header are
what the browser sends in that case."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.dashboard.conftest import Proc, free_port

pytest.importorskip("aiohttp")  # the dashboard extra

pytestmark = pytest.mark.timeout(300)


def request(url: str, host: str, form: dict[str, str] | None = None) -> tuple[int, str]:
    """GET ``url`` (POST ``form``, with an Origin of ``host``) sent with the Host header ``host``."""
    data = urllib.parse.urlencode(form).encode() if form is not None else None
    req = urllib.request.Request(url, data=data, headers={"Host": host})
    if form is not None:
        req.add_header("Origin", f"http://{host}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_an_open_dashboard_answers_no_other_host_name(cluster: dict[str, Any]) -> None:
    for base in (cluster["url"], cluster["inbroker"]):  # `cometmq dashboard`, and the broker's own
        port = urllib.parse.urlsplit(base).port
        status, text = request(base + "/topics", f"rebind.example:{port}")
        assert status == 403 and "allowed host" in text, (base, status, text[:200])
        # an action a rebinding page would take: refused, and nothing made
        status, _ = request(base + "/topics", f"rebind.example:{port}",
                            {"topic": "RebindTopic", "queues": "1", "confirm": "yes"})
        assert status == 403
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", f"10.1.2.3:{port}"):
            status, text = request(base + "/topics", host)
            assert status == 200 and "RebindTopic" not in text, (host, status)


def test_a_host_name_allowed_is_answered(cluster: dict[str, Any]) -> None:
    port = free_port()
    board = Proc(["dashboard", "--namesrv", cluster["namesrv"], "--port", str(port), "--interval", "1",
                  "--allowed-host", "Dash.Example", "--read-only"], "cometmq dashboard on",
                 cluster["dir"] / "allowed.log")
    try:
        assert request(f"http://127.0.0.1:{port}/topics", f"dash.example:{port}")[0] == 200
        assert request(f"http://127.0.0.1:{port}/topics", f"other.example:{port}")[0] == 403
    finally:
        board.stop()


def test_the_brokers_dashboard_with_acl_on_and_no_login_stays_on_loopback(tmp_path: Path) -> None:
    """With aclEnable the broker's own dashboard acts with the broker's admin credentials: without a users file,
    anyone who reached it passed the ACL. Bound beyond loopback it is refused (before it binds), and so is the
    broker's start; on loopback it runs (the package's ACL cluster in test_login.py)."""
    acl = tmp_path / "plain_acl.yml"
    acl.write_text("accounts:\n  - accessKey: dashAdmin02\n    secretKey: dashAdminSecret02\n    admin: true\n")
    conf = tmp_path / "broker.conf"
    conf.write_text(f"aclEnable=true\naclFile={acl}\nmetricsPrometheusHost=0.0.0.0\ninnerClientAuthentication"
                    'Credentials={"accessKey": "dashAdmin02", "secretKey": "dashAdminSecret02"}\n')
    ns, bp, dash = free_port(), free_port(), free_port()
    run = subprocess.run([sys.executable, "-m", "cometmq.cli", "serve", "--data", str(tmp_path / "data"),
                          "--namesrv-port", str(ns), "--broker-port", str(bp), "--grpc-port", "0", "-c", str(conf),
                          "--dashboard-port", str(dash)], capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in os.environ.items() if k != "COMETMQ_DASHBOARD_USERS_FILE"})
    assert run.returncode != 0 and "COMETMQ_DASHBOARD_USERS_FILE" in run.stderr + run.stdout, run.stderr[-2000:]
