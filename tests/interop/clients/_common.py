"""Helpers shared by the interop client scripts (run as ``python tests/interop/clients/<x>.py``).

Every script prints JSON lines on stdout (one object per line, flushed at once) with an
``event`` key.  Common events: ``started`` (client started), ``fatal`` (exit code 3),
``summary`` (counters), and ``closed`` as the very last line once shutdown() returned.  A run
that has ``summary``/``stopping`` but no ``closed`` and rc -6/134 hit the C++ client's shutdown
abort (see :func:`wait_out_route_timer`).

The scripts import the ``rocketmq`` wheel lazily (after argument parsing) so ``--help`` works
without it.  The wheel writes logs to ``$HOME/logs/rocketmq-cpp/`` and broadcasting offsets to
``$HOME/.rocketmq_offsets/``: callers must point ``HOME`` at a temporary directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from typing import Any

EXIT_OK = 0
EXIT_FAILURES = 1
EXIT_TIMEOUT = 2
EXIT_FATAL = 3

LOG_LEVELS = {"fatal": 1, "error": 2, "warn": 3, "info": 4, "debug": 5, "trace": 6}

# Properties worth reporting on received messages (name -> JSON key).
INTERESTING_PROPS = {
    "UNIQ_KEY": "uniq_key",
    "WAIT": "wait",
    "DELAY": "delay",
    "RETRY_TOPIC": "retry_topic",
    "REAL_TOPIC": "real_topic",
    "REAL_QID": "real_qid",
    "ORIGIN_MESSAGE_ID": "origin_message_id",
    "RECONSUME_TIME": "reconsume_time",
    "MAX_RECONSUME_TIMES": "max_reconsume_times",
    "MIN_OFFSET": "min_offset",
    "MAX_OFFSET": "max_offset",
    "PGROUP": "pgroup",
}

_emit_lock = threading.Lock()


def add_credential_args(ap: Any) -> None:
    """``--access-key/--secret-key/--channel``: the wheel's set_session_credentials (ACL, docs/security.md)."""
    ap.add_argument("--access-key", default=None, help="ACL access key (the client signs every request)")
    ap.add_argument("--secret-key", default=None, help="ACL secret key")
    ap.add_argument("--channel", default="ALIYUN", help="the OnsChannel field the C++ client signs too")


def emit(obj: dict[str, Any]) -> None:
    """Print one JSON line and flush (thread-safe: consumer callbacks run on C++ threads)."""
    line = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    with _emit_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def fatal(msg: str, **extra: Any) -> None:
    emit({"event": "fatal", "error": msg, **extra})
    sys.exit(EXIT_FATAL)


def load_wheel() -> Any:
    """Import ``rocketmq.client`` or exit with a ``fatal`` line."""
    try:
        import rocketmq.client as client
    except Exception as exc:  # ImportError or OSError from ctypes
        fatal(f"cannot load the rocketmq wheel: {exc!r}")
    return client


def dll() -> Any:
    from rocketmq.ffi import dll as _dll

    return _dll


def set_log_level(kind: str, handle: int, level: str | None) -> None:
    """kind: Producer / PushConsumer / PullConsumer (C API name part)."""
    if not level:
        return
    fn = getattr(dll(), f"Set{kind}LogLevel")
    fn(handle, LOG_LEVELS[level])


def as_text(val: bytes | str | None) -> str | None:
    if val is None:
        return None
    if isinstance(val, bytes):
        return val.decode("utf-8", errors="replace")
    return val


def body_fields(body: bytes | None, max_print: int) -> dict[str, Any]:
    """body, body_len, body_sha256 (body omitted/truncated beyond ``max_print`` bytes).

    NB: the wheel reads bodies through ``c_char_p`` (GetMessageBody) so received bodies are cut
    at the first NUL byte: use text bodies in tests.
    """
    body = body or b""
    out: dict[str, Any] = {"body_len": len(body), "body_sha256": hashlib.sha256(body).hexdigest()}
    if max_print < 0 or len(body) <= max_print:
        out["body"] = body.decode("utf-8", errors="replace")
    else:
        out["body"] = body[:max_print].decode("utf-8", errors="replace")
        out["body_truncated"] = True
    return out


def message_fields(msg: Any, max_print: int) -> dict[str, Any]:
    """Everything the C API exposes about a received message (``rocketmq.client.RecvMessage``)."""
    out: dict[str, Any] = {
        "msg_id": msg.id,
        "topic": msg.topic,
        "tags": as_text(msg.tags),
        "keys": as_text(msg.keys),
        "queue_id": msg.queue_id,
        "queue_offset": msg.queue_offset,
        "commit_log_offset": msg.commit_log_offset,
        "reconsume_times": msg.reconsume_times,
        "store_size": msg.store_size,
        "born_ts": msg.born_timestamp,
        "store_ts": msg.store_timestamp,
        "delay_level": msg.delay_time_level,
    }
    out.update(body_fields(msg.body, max_print))
    props = {}
    for name, key in INTERESTING_PROPS.items():
        val = msg.get_property(name)
        if val:
            props[key] = as_text(val)
    out["props"] = props
    return out


# The C++ client refreshes topic routes 3 s after start() and every 30 s after that.  Calling
# shutdown() while that timer task runs aborts the process ("terminate called after throwing an
# instance of 'boost::thread_interrupted'", SIGABRT, rc 134 / -6).  Reproduced reliably by shutting
# down 3.000-3.004 s after start() (push, broadcast and pull consumers alike), never at 5 s or 10 s.
ROUTE_TIMER_FIRST_S = 3.0
ROUTE_TIMER_PERIOD_S = 30.0
ROUTE_TIMER_GUARD_BEFORE_S = 0.25
ROUTE_TIMER_GUARD_AFTER_S = 0.75


def wait_out_route_timer(started_at: float) -> float:
    """Sleep until shutdown is safe w.r.t. the route timer; returns the seconds slept.

    ``started_at`` is ``time.monotonic()`` taken just before ``start()``.
    """
    elapsed = time.monotonic() - started_at
    if elapsed < ROUTE_TIMER_FIRST_S - ROUTE_TIMER_GUARD_BEFORE_S:
        return 0.0
    phase = (elapsed - ROUTE_TIMER_FIRST_S) % ROUTE_TIMER_PERIOD_S
    if phase > ROUTE_TIMER_PERIOD_S - ROUTE_TIMER_GUARD_BEFORE_S:
        phase -= ROUTE_TIMER_PERIOD_S
    if -ROUTE_TIMER_GUARD_BEFORE_S <= phase <= ROUTE_TIMER_GUARD_AFTER_S:
        delay = ROUTE_TIMER_GUARD_AFTER_S - phase
        time.sleep(delay)
        return delay
    return 0.0


def shutdown_and_destroy(obj: Any, kind: str, started_at: float, emit_closed: bool = True) -> None:
    """shutdown() + Destroy<kind>() now, avoiding the route-timer abort window.

    Destroying here (and clearing ``_handle``) stops the wheel's ``__del__`` from shutting the
    client down a second time at interpreter exit.
    """
    if obj._handle is None:
        return
    waited = wait_out_route_timer(started_at)
    obj.shutdown()
    getattr(dll(), f"Destroy{kind}")(obj._handle)
    obj._handle = None
    if emit_closed:
        emit({"event": "closed", "waited_for_route_timer_s": round(waited, 3)})


def now_ns() -> int:
    return time.time_ns()


def pid_info() -> dict[str, Any]:
    return {"pid": os.getpid(), "home": os.environ.get("HOME")}


def c_str(s: str | bytes) -> bytes:
    return s.encode("utf-8") if isinstance(s, str) else s
