"""Fixtures for interop tests that drive the official RocketMQ 4.x C++ client (PyPI
``rocketmq==0.4.4``) in subprocesses.  See docs/interop-notes.md.

* Every test collected under tests/interop/ gets ``pytest.mark.interop``
  (deselect with ``-m "not interop"``).
* ``rocketmq_wheel`` (session): loads the wheel once in a subprocess; skips the requesting
  tests with the reason if it cannot load.  ``cpp_client_env`` and ``cpp_client`` depend on it.
* ``cpp_client_env``: env dict with HOME in a per-test temporary folder (the C++ client writes
  ``$HOME/logs/rocketmq-cpp/*.log`` and ``$HOME/.rocketmq_offsets/``).
* ``cpp_client``: ``cpp_client.run("produce", namesrv=..., topic=..., count=3)`` /
  ``cpp_client.start("push_consume", ...)`` bound to that env.
* ``frame_recorder``: tests/interop/frame_recorder.py answering as name server + broker.
* ``cometmq_server``: a factory starting a real ``cometmq serve`` subprocess
  (:class:`tests.interop.cometmq_server.CometServer`: free ports, temporary data folder, broker.conf from
  ``DEFAULT_CONF`` plus overrides, ``restart()`` on the same data and ports); every server it started is
  stopped after the test.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.interop.cometmq_server import CometServer
from tests.interop.harness import INTEROP_DIR, CppClientRunner, FrameRecorder, check_wheel, client_env


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if INTEROP_DIR in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.interop)


@pytest.fixture(scope="session")
def rocketmq_wheel(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Python executable that can load the wheel (skips the test otherwise)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("rocketmq==0.4.4 ships a manylinux1 x86_64 librocketmq.so only")
    env = client_env(tmp_path_factory.mktemp("wheel-check-home"))
    reason = check_wheel(env)
    if reason:
        pytest.skip(reason)
    return sys.executable


@pytest.fixture
def cpp_client_env(tmp_path: Path, rocketmq_wheel: str) -> dict[str, str]:
    """Environment for C++ client subprocesses: HOME = <tmp_path>/home, NAMESRV_ADDR removed."""
    return client_env(tmp_path / "home")


@pytest.fixture
def cpp_client(cpp_client_env: dict[str, str], rocketmq_wheel: str) -> Iterator[CppClientRunner]:
    runner = CppClientRunner(cpp_client_env, rocketmq_wheel)
    yield runner
    runner.close()


@pytest.fixture
def frame_recorder(tmp_path: Path) -> Iterator[FrameRecorder]:
    """A fake name server + broker that records every frame (tmp_path/recorder/frames.jsonl)."""
    with FrameRecorder(tmp_path / "recorder", respond=True) as rec:
        yield rec


@pytest.fixture
def cometmq_server(tmp_path: Path) -> Iterator[Callable[..., CometServer]]:
    """``cometmq_server(conf={...}, start=True)`` -> a running :class:`CometServer` (stopped at teardown)."""
    servers: list[CometServer] = []

    def make(conf: dict[str, str] | None = None, start: bool = True) -> CometServer:
        server = CometServer(tmp_path / f"cometmq-{len(servers)}", conf)
        servers.append(server)
        if start:
            server.start()
        return server

    yield make
    for server in servers:
        server.close()
