"""Send messages with the official RocketMQ C++ client (PyPI ``rocketmq==0.4.4``).

One JSON line per message::

    {"event":"sent","index":0,"mode":"sync","status":"OK","msg_id":"...","queue_offset":0,
     "queue_id":null,"topic":"T","tags":"TagA","keys":"k-0","body_len":5,"body_sha256":"...",
     "send_ns":...,"elapsed_ms":1.2}

or ``{"event":"error","index":i,...,"error":"..."}``; then
``{"event":"summary","sent":n,"failed":m,...}`` and, after shutdown, ``{"event":"closed",...}``.
Exit code 0 if every send succeeded, 1 if some failed, 3 if the wheel cannot load.

``--duration-s S`` stops sending after S seconds (``--count`` is then an upper bound); SIGTERM or SIGINT stops
sending after the current send, then prints the summary and shuts down as usual (so a test can run a producer in
a loop, e.g. across a failover, and stop it when it has seen enough).

Notes on what the wheel reports: ``msg_id`` is the client-side UNIQ_KEY (not the broker's
offset id), ``queue_offset`` is the broker's ``queueOffset`` reply field, and the queue id is not
exposed for sync/async/batch sends (``queue_id`` is null) -- only ``orderly`` mode knows it
because this script chooses the queue.  Oneway sends report ``status`` "ONEWAY" and no id.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import signal
import threading
import time
from typing import Any

import _common as c


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Send messages with the RocketMQ C++ client (wheel 0.4.4).")
    ap.add_argument("--namesrv", required=True, help="name server address host:port[;host:port]")
    ap.add_argument("--topic", required=True)
    ap.add_argument("--group", default="PG_cometmq_interop", help="producer group")
    ap.add_argument("--count", type=int, default=1, help="number of messages")
    ap.add_argument("--tags", default=None,
                    help="tag, or comma-separated tags used round-robin (index %% n)")
    ap.add_argument("--keys", default=None,
                    help="keys template; '{i}' is replaced by the message index; "
                         "several keys are space-separated, e.g. 'k-{i} order-{i}'")
    ap.add_argument("--body", default="msg-{i}", help="body template; '{i}' = message index")
    ap.add_argument("--body-size", type=int, default=0,
                    help="pad (or cut) every body to exactly this many bytes (ASCII 'x' padding); "
                         "bodies >= 4096 bytes are zlib-compressed by the client")
    ap.add_argument("--mode", choices=["sync", "async", "oneway", "orderly", "batch"], default="sync")
    ap.add_argument("--order-arg", default="0",
                    help="orderly mode: int selector argument (queue = arg %% queue count), "
                         "or 'index' to use the message index")
    ap.add_argument("--batch-size", type=int, default=0,
                    help="batch mode: messages per batch (0 = all --count messages in one batch)")
    ap.add_argument("--delay-level", type=int, default=0, help="delay level 1..18 (0 = none)")
    ap.add_argument("--property", action="append", default=[], metavar="KEY=VALUE",
                    help="extra user property (repeatable)")
    ap.add_argument("--timeout-ms", type=int, default=3000, help="send timeout (client default 3000)")
    ap.add_argument("--async-wait", type=float, default=30.0,
                    help="async mode: seconds to wait for all callbacks")
    ap.add_argument("--interval-ms", type=float, default=0, help="pause between sends")
    ap.add_argument("--instance-name", default=None, help="client instance name (clientID suffix)")
    ap.add_argument("--log-level", choices=sorted(c.LOG_LEVELS), default=None)
    ap.add_argument("--max-print", type=int, default=-1, help="unused (symmetry with consumers)")
    ap.add_argument("--stop-on-error", action="store_true", help="stop at the first failed send")
    ap.add_argument("--duration-s", type=float, default=0,
                    help="stop sending after this many seconds (0 = no limit; --count is then an upper bound)")
    c.add_credential_args(ap)
    return ap.parse_args(argv)


def make_body(args: argparse.Namespace, i: int) -> bytes:
    body = args.body.replace("{i}", str(i)).encode("utf-8")
    if args.body_size > 0:
        body = (body + b"x" * args.body_size)[: args.body_size]
    return body


def tag_for(args: argparse.Namespace, i: int) -> str | None:
    if args.tags is None:
        return None
    tags = args.tags.split(",")
    return tags[i % len(tags)]


def build_message(client: Any, args: argparse.Namespace, i: int) -> tuple[Any, dict[str, Any]]:
    msg = client.Message(args.topic)
    body = make_body(args, i)
    # SetByteMessageBody keeps the exact bytes (set_body goes through c_char_p).
    c.dll().SetByteMessageBody(msg._handle, body, len(body))
    tags = tag_for(args, i)
    if tags is not None:
        msg.set_tags(tags)
    keys = args.keys.replace("{i}", str(i)) if args.keys is not None else None
    if keys is not None:
        msg.set_keys(keys)
    if args.delay_level:
        msg.set_delay_time_level(args.delay_level)
    for prop in args.property:
        k, _, v = prop.partition("=")
        msg.set_property(k, v)
    info = {"index": i, "topic": args.topic, "tags": tags, "keys": keys, "body_len": len(body),
            "body_sha256": hashlib.sha256(body).hexdigest()}
    return msg, info


def result_fields(res: Any) -> dict[str, Any]:
    return {"status": res.status.name, "msg_id": res.msg_id, "queue_offset": res.offset}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    client = c.load_wheel()
    producer = client.Producer(args.group, timeout=args.timeout_ms)
    producer.set_namesrv_addr(args.namesrv)
    if args.access_key:  # ACL (docs/security.md): the client signs every request
        producer.set_session_credentials(args.access_key, args.secret_key, args.channel)
    if args.instance_name:
        c.dll().SetProducerInstanceName(producer._handle, c.c_str(args.instance_name))
    c.set_log_level("Producer", producer._handle, args.log_level)
    t_start = time.monotonic()
    t_end = t_start + args.duration_s if args.duration_s > 0 else float("inf")

    def should_stop() -> bool:
        return stop.is_set() or time.monotonic() >= t_end

    try:
        producer.start()
    except Exception as exc:
        c.fatal(f"producer start failed: {exc}")
    c.emit({"event": "started", "role": "producer", "mode": args.mode, **c.pid_info()})

    sent = failed = 0
    async_done = threading.Semaphore(0)
    async_pending = 0

    def report_ok(info: dict[str, Any], extra: dict[str, Any], t0: float) -> None:
        nonlocal sent
        sent += 1
        c.emit({"event": "sent", "mode": args.mode, **info, **extra, "send_ns": c.now_ns(),
                "elapsed_ms": round((time.monotonic() - t0) * 1000, 3)})

    def report_err(info: dict[str, Any], exc: BaseException, t0: float) -> None:
        nonlocal failed
        failed += 1
        c.emit({"event": "error", "mode": args.mode, **info, "error": f"{type(exc).__name__}: {exc}",
                "send_ns": c.now_ns(), "elapsed_ms": round((time.monotonic() - t0) * 1000, 3)})

    try:
        if args.mode == "batch":
            size = args.batch_size or max(args.count, 1)
            for b, start in enumerate(range(0, args.count, size)):
                if should_stop():
                    break
                built = [build_message(client, args, i) for i in range(start, min(start + size, args.count))]
                t0 = time.monotonic()
                try:
                    res = producer.send_batch([m for m, _ in built])
                except Exception as exc:
                    for _, info in built:
                        report_err({**info, "batch": b}, exc, t0)
                    if args.stop_on_error:
                        break
                else:
                    for _, info in built:
                        report_ok({**info, "batch": b}, {**result_fields(res), "queue_id": None}, t0)
                if args.interval_ms:
                    time.sleep(args.interval_ms / 1000)
        else:
            for i in range(args.count):
                if should_stop():
                    break
                msg, info = build_message(client, args, i)
                t0 = time.monotonic()
                try:
                    if args.mode == "sync":
                        res = producer.send_sync(msg)
                        report_ok(info, {**result_fields(res), "queue_id": None}, t0)
                    elif args.mode == "oneway":
                        producer.send_oneway(msg)
                        report_ok(info, {"status": "ONEWAY", "msg_id": None, "queue_offset": None,
                                         "queue_id": None}, t0)
                    elif args.mode == "orderly":
                        arg = i if args.order_arg == "index" else int(args.order_arg)
                        chosen: dict[str, int] = {}

                        def selector(mq_size: int, _msg: Any, user_arg: Any, _chosen: dict[str, int] = chosen
                                     ) -> int:
                            q = int(ctypes.cast(user_arg, ctypes.POINTER(ctypes.c_int))[0]) % mq_size
                            _chosen["queue_id"], _chosen["queue_count"] = q, mq_size
                            return q

                        res = producer.send_orderly(msg, arg, queue_selector=selector)
                        report_ok(info, {**result_fields(res), "order_arg": arg, **chosen}, t0)
                    else:  # async
                        async_pending += 1

                        def on_ok(res: Any, _info: dict[str, Any] = info, _t0: float = t0) -> None:
                            report_ok(_info, {**result_fields(res), "queue_id": None}, _t0)
                            async_done.release()

                        def on_err(exc: BaseException, _info: dict[str, Any] = info, _t0: float = t0) -> None:
                            report_err(_info, exc, _t0)
                            async_done.release()

                        producer.send_async(msg, on_ok, on_err)
                except Exception as exc:
                    if args.mode == "async":
                        async_pending -= 1
                    report_err(info, exc, t0)
                    if args.stop_on_error:
                        break
                if args.interval_ms:
                    time.sleep(args.interval_ms / 1000)
            deadline = time.monotonic() + args.async_wait
            while async_pending > 0 and async_done.acquire(timeout=max(0.0, deadline - time.monotonic())):
                async_pending -= 1
    finally:
        summary = {"event": "summary", "role": "producer", "mode": args.mode, "requested": args.count,
                   "sent": sent, "failed": failed, "async_missing": async_pending,
                   "elapsed_s": round(time.monotonic() - t_start, 3)}
        c.emit(summary)
        c.shutdown_and_destroy(producer, "Producer", t_start)
    return c.EXIT_OK if failed == 0 and sent == args.count else c.EXIT_FAILURES


if __name__ == "__main__":
    raise SystemExit(main())
