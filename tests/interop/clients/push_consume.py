"""Consume with the official RocketMQ C++ client's PushConsumer (PyPI ``rocketmq==0.4.4``).

Prints ``{"event":"started",...}`` once the consumer has started, then one line per delivery::

    {"event":"msg","n":1,"msg_id":"...","topic":"T","tags":"TagA","keys":"k-0","body":"msg-0",
     "body_len":5,"body_sha256":"...","queue_id":0,"queue_offset":0,"commit_log_offset":0,
     "reconsume_times":0,"store_size":...,"born_ts":...,"store_ts":...,"delay_level":0,
     "props":{"uniq_key":"...","wait":"true"},"recv_ns":...,"thread":...,
     "status":"CONSUME_SUCCESS"}

``status`` is what this script answered (CONSUME_SUCCESS or RECONSUME_LATER).  When it stops:
``{"event":"stopping",...counters}``, shutdown, then
``{"event":"summary","received":..,"acked":..,"reconsume_later":..,"reason":..}`` and
``{"event":"closed"}``.  Deliveries that race with shutdown are still printed (and acknowledged).

Stops when ``--count`` messages were acknowledged (exit 0), when ``--seconds`` are up (exit 0 if
no ``--count`` was given, else 2), after ``--idle-seconds`` without deliveries (exit 0), or on
SIGTERM/SIGINT (exit 0).  The consumer is shut down cleanly in every case.

Wheel caveat: ``PushConsumer.subscribe`` wraps the callback and re-raises its exception inside
the ctypes callback, so ctypes prints a traceback and the int handed back to C++ is not one the
wrapper chose (observed: treated as a failure).  This script therefore registers its own raw
callback that returns 0 (CONSUME_SUCCESS) / 1 (RECONSUME_LATER) explicitly.

C++ 1.2.3 behaviour to expect: one RECONSUME_LATER makes the client send back (code 36) *every*
message of that pulled batch (up to 32), including ones the callback never saw; they come back
from ``%RETRY%<group>`` with reconsume_times 1.  Orderly consumers retry locally instead.
"""

from __future__ import annotations

import argparse
import signal
import threading
import time
from typing import Any

import _common as c

CONSUME_SUCCESS = 0
RECONSUME_LATER = 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Consume with the RocketMQ C++ PushConsumer (wheel 0.4.4).")
    ap.add_argument("--namesrv", required=True, help="name server address host:port[;host:port]")
    ap.add_argument("--topic", required=True)
    ap.add_argument("--group", default="CG_cometmq_interop", help="consumer group")
    ap.add_argument("--expression", default="*", help="tag expression, e.g. 'TagA || TagB'")
    ap.add_argument("--broadcast", action="store_true", help="BROADCASTING instead of CLUSTERING")
    ap.add_argument("--orderly", action="store_true", help="orderly listener (queue locks)")
    ap.add_argument("--count", type=int, default=0, help="exit after this many acknowledged messages")
    ap.add_argument("--seconds", type=float, default=60.0, help="maximum run time")
    ap.add_argument("--idle-seconds", type=float, default=0,
                    help="exit after this long without any delivery (0 = off; counted from the "
                         "first delivery, or from start if --idle-from-start)")
    ap.add_argument("--idle-from-start", action="store_true")
    ap.add_argument("--reconsume-later-first-n", type=int, default=0,
                    help="answer RECONSUME_LATER to the first N deliveries (over all messages)")
    ap.add_argument("--reconsume-later-until", type=int, default=0,
                    help="answer RECONSUME_LATER while the message's reconsume_times < K")
    ap.add_argument("--sleep-ms", type=float, default=0, help="sleep in the callback (slow consumer)")
    ap.add_argument("--thread-count", type=int, default=0, help="consume threads (0 = client default)")
    ap.add_argument("--batch-max-size", type=int, default=0, help="consumeMessageBatchMaxSize (0 = default)")
    ap.add_argument("--instance-name", default=None, help="client instance name (clientID suffix)")
    ap.add_argument("--log-level", choices=sorted(c.LOG_LEVELS), default=None)
    c.add_credential_args(ap)
    ap.add_argument("--max-print", type=int, default=4096,
                    help="print at most this many body bytes (-1 = all); sha256 is always exact")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    client = c.load_wheel()
    from rocketmq.exceptions import ffi_check
    from rocketmq.ffi import MessageModel

    model = MessageModel.BROADCASTING if args.broadcast else MessageModel.CLUSTERING
    consumer = client.PushConsumer(args.group, orderly=args.orderly, message_model=model)
    consumer.set_namesrv_addr(args.namesrv)
    if args.instance_name:
        consumer.set_instance_name(args.instance_name)
    if args.thread_count:
        consumer.set_thread_count(args.thread_count)
    if args.batch_max_size:
        consumer.set_message_batch_max_size(args.batch_max_size)
    c.set_log_level("PushConsumer", consumer._handle, args.log_level)
    if args.access_key:  # ACL (docs/security.md): the client signs every request
        consumer.set_session_credentials(args.access_key, args.secret_key, args.channel)

    lock = threading.Lock()
    stop = threading.Event()
    counters = {"received": 0, "acked": 0, "reconsume_later": 0, "callback_errors": 0}
    last_delivery = [time.monotonic()]
    reason = ["time"]

    def on_message(_consumer: Any, handle: Any) -> int:
        recv_ns = c.now_ns()
        status = CONSUME_SUCCESS
        try:
            msg = client.RecvMessage(handle)
            fields = c.message_fields(msg, args.max_print)
            with lock:
                counters["received"] += 1
                n = counters["received"]
                last_delivery[0] = time.monotonic()
                if n <= args.reconsume_later_first_n or fields["reconsume_times"] < args.reconsume_later_until:
                    status = RECONSUME_LATER
                    counters["reconsume_later"] += 1
                else:
                    counters["acked"] += 1
                acked = counters["acked"]
            if args.sleep_ms:
                time.sleep(args.sleep_ms / 1000)
            c.emit({"event": "msg", "n": n, **fields, "recv_ns": recv_ns, "thread": threading.get_ident(),
                    "status": "CONSUME_SUCCESS" if status == CONSUME_SUCCESS else "RECONSUME_LATER"})
            if args.count and acked >= args.count and not stop.is_set():
                reason[0] = "count"
                stop.set()
        except Exception as exc:  # never let an exception escape into the C++ thread
            with lock:
                counters["callback_errors"] += 1
            c.emit({"event": "callback_error", "error": repr(exc)})
            return RECONSUME_LATER
        return status

    def on_signal(signum: int, _frame: Any) -> None:
        reason[0] = f"signal {signum}"
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    # Same as PushConsumer.subscribe() but with our raw callback (see module docstring).
    ffi_check(c.dll().Subscribe(consumer._handle, c.c_str(args.topic), c.c_str(args.expression)))
    consumer._register_callback(on_message)
    t_start = time.monotonic()
    try:
        consumer.start()
    except Exception as exc:
        c.fatal(f"push consumer start failed: {exc}")
    last_delivery[0] = time.monotonic()
    c.emit({"event": "started", "role": "push_consumer", "topic": args.topic, "group": args.group,
            "expression": args.expression, "broadcast": args.broadcast, "orderly": args.orderly,
            **c.pid_info()})

    deadline = t_start + args.seconds
    while not stop.is_set():
        now = time.monotonic()
        if now >= deadline:
            reason[0] = "time"
            break
        with lock:
            got_any = counters["received"] > 0
            idle_for = now - last_delivery[0]
        if args.idle_seconds and (got_any or args.idle_from_start) and idle_for >= args.idle_seconds:
            reason[0] = "idle"
            break
        stop.wait(min(0.05, max(0.0, deadline - now)))

    with lock:
        c.emit({"event": "stopping", "role": "push_consumer", **counters, "reason": reason[0]})
    t_stop = time.monotonic()
    c.shutdown_and_destroy(consumer, "PushConsumer", t_start, emit_closed=False)
    with lock:
        summary = {"event": "summary", "role": "push_consumer", **counters, "reason": reason[0],
                   "elapsed_s": round(t_stop - t_start, 3),
                   "shutdown_s": round(time.monotonic() - t_stop, 3)}
    c.emit(summary)
    c.emit({"event": "closed"})
    if args.count and summary["acked"] < args.count:
        return c.EXIT_TIMEOUT
    return c.EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
