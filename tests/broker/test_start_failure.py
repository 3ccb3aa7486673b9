"""A broker whose start fails after its store started (its port taken) stops what it started: the store shut down
cleanly (no abort file, so the next start does not recover as after a crash), no service thread, no listening
socket, the data folder let go; and the error names the port."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from cometmq.broker.controller import BrokerController
from tests.broker.conftest import broker_config
from tests.kit.ports import free_port


def can_listen(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen()
        except OSError:
            return False
        return True


def service_threads() -> set[str]:
    """The threads alive now but the event loop's executor workers (which stay for the next call)."""
    return {t.name for t in threading.enumerate() if not t.name.startswith(("uvloop_", "asyncio_", "ThreadPool"))}


async def test_a_broker_whose_port_is_taken_stops_what_it_started(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "broker"
    # a clean run first: with its checkpoint, an abort file left behind would make the next start a crash recovery
    first = BrokerController(broker_config(path))
    await first.start()
    await first.stop()
    threads_before = service_threads()
    ha_port = free_port()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        failed = BrokerController(broker_config(path, listen_port=port, ha_listen_port=ha_port))
        with pytest.raises(OSError, match=rf"127\.0\.0\.1', {port}\): address already in use"):
            await failed.start()
    assert failed.store.recovered_abnormally is False
    assert not (path / "abort").exists()
    assert not failed.store.running
    assert service_threads() == threads_before  # the store's flush, index, clean... threads
    assert can_listen(port) and can_listen(ha_port)  # the HA port's server (started before the remoting one) is gone
    # another process can take the data folder: this one let go of its lock
    lock = subprocess.run([sys.executable, "-c", "import sys; from cometmq.store.dir_lock import lock_data_folder; "
                           "lock_data_folder(sys.argv[1])", str(path)], capture_output=True, text=True, timeout=60)
    assert lock.returncode == 0, lock.stderr

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="cometmq.store.recovery"):
        second = BrokerController(broker_config(path))
        await second.start()
    try:
        assert second.store.recovered_abnormally is False
        assert "recovery after a clean stop" in caplog.text and "after a crash" not in caplog.text
    finally:
        await second.stop()
