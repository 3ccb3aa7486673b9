"""Read every queue of a topic with the official RocketMQ C++ client's PullConsumer.

For each queue returned by FetchSubscriptionMessageQueues (sorted by broker name, queue id) this
pulls from ``--start-offset`` (default 0) until the broker says there is nothing new.  Lines::

    {"event":"started",...}
    {"event":"queue","topic":"T","broker":"b","queue_id":0}
    {"event":"pull","queue_id":0,"offset":0,"status":"FOUND","next":3,"min":0,"max":3,"found":3}
    {"event":"msg","queue_id":0,"msg_id":"...","body":"msg-0",...}     (same fields as push_consume)
    {"event":"queue_done","queue_id":0,"next":3,"reason":"NO_NEW_MSG"}
    {"event":"summary","received":3,"queues":4,"errors":0,...}
    {"event":"closed",...}

It does not use the wheel's ``PullConsumer.pull()`` generator: that one keeps offsets in a
class-level dict keyed only by "topic@queueId" and retries BROKER_TIMEOUT forever.  Here a
BROKER_TIMEOUT (the C API's status for any pull exception) is retried ``--max-errors`` times,
then the queue is abandoned (exit code 1).  NO_MATCHED_MSG / OFFSET_ILLEGAL continue from
``nextBeginOffset`` as long as it advances.
"""

from __future__ import annotations

import argparse
import ctypes
import time
from typing import Any

import _common as c

STATUS_NAMES = {0: "FOUND", 1: "NO_NEW_MSG", 2: "NO_MATCHED_MSG", 3: "OFFSET_ILLEGAL", 4: "BROKER_TIMEOUT"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Read all queues with the RocketMQ C++ PullConsumer (wheel 0.4.4).")
    ap.add_argument("--namesrv", required=True, help="name server address host:port[;host:port]")
    ap.add_argument("--topic", required=True)
    ap.add_argument("--group", default="CG_cometmq_interop_pull", help="consumer group")
    ap.add_argument("--expression", default="*", help="tag expression, e.g. 'TagA || TagB'")
    ap.add_argument("--start-offset", type=int, default=0)
    ap.add_argument("--queue", type=int, action="append", default=None,
                    help="only this queue id (repeatable; default all)")
    ap.add_argument("--max-num", type=int, default=32, help="maxMsgNums per pull")
    ap.add_argument("--max-errors", type=int, default=3, help="BROKER_TIMEOUT retries per queue")
    ap.add_argument("--max-pulls", type=int, default=100000, help="safety cap on pulls per queue")
    ap.add_argument("--log-level", choices=sorted(c.LOG_LEVELS), default=None)
    ap.add_argument("--max-print", type=int, default=4096,
                    help="print at most this many body bytes (-1 = all); sha256 is always exact")
    c.add_credential_args(ap)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    client = c.load_wheel()
    from rocketmq.exceptions import ffi_check
    from rocketmq.ffi import _CMessageQueue

    dll = c.dll()
    consumer = client.PullConsumer(args.group)
    consumer.set_namesrv_addr(args.namesrv)
    if args.access_key:
        consumer.set_session_credentials(args.access_key, args.secret_key, args.channel)
    c.set_log_level("PullConsumer", consumer._handle, args.log_level)
    t_start = time.monotonic()
    try:
        consumer.start()
    except Exception as exc:
        c.fatal(f"pull consumer start failed: {exc}")
    c.emit({"event": "started", "role": "pull_consumer", "topic": args.topic, "group": args.group,
            "expression": args.expression, **c.pid_info()})

    received = errors = 0
    queues_done: list[dict[str, Any]] = []
    mqs = ctypes.POINTER(_CMessageQueue)()
    size = ctypes.c_int()
    try:
        try:
            ffi_check(dll.FetchSubscriptionMessageQueues(consumer._handle, c.c_str(args.topic),
                                                         ctypes.pointer(mqs), ctypes.pointer(size)))
        except Exception as exc:
            c.fatal(f"FetchSubscriptionMessageQueues failed: {exc}")
        queues = [mqs[i] for i in range(size.value)]
        queues.sort(key=lambda q: (q.brokerName, q.queueId))
        for mq in queues:
            if args.queue is not None and mq.queueId not in args.queue:
                continue
            c.emit({"event": "queue", "topic": mq.topic.decode(), "broker": mq.brokerName.decode(),
                    "queue_id": mq.queueId})
            offset, errs, reason = args.start_offset, 0, "max_pulls"
            for _ in range(args.max_pulls):
                t0 = time.monotonic()
                res = dll.Pull(consumer._handle, ctypes.pointer(mq), c.c_str(args.expression), offset,
                               args.max_num)
                try:
                    status = STATUS_NAMES.get(res.pullStatus, str(res.pullStatus))
                    c.emit({"event": "pull", "queue_id": mq.queueId, "offset": offset, "status": status,
                            "next": res.nextBeginOffset, "min": res.minOffset, "max": res.maxOffset,
                            "found": res.size if res.pullStatus == 0 else 0,
                            "elapsed_ms": round((time.monotonic() - t0) * 1000, 3)})
                    if res.pullStatus == 0:
                        for i in range(res.size):
                            msg = client.RecvMessage(res.msgFoundList[i])
                            received += 1
                            c.emit({"event": "msg", "n": received, **c.message_fields(msg, args.max_print),
                                    "recv_ns": c.now_ns()})
                finally:
                    dll.ReleasePullResult(res)
                if status == "BROKER_TIMEOUT":
                    errs += 1
                    errors += 1
                    if errs > args.max_errors:
                        reason = "BROKER_TIMEOUT"
                        break
                    continue
                if status == "NO_NEW_MSG":
                    reason = status
                    offset = res.nextBeginOffset
                    break
                if res.nextBeginOffset <= offset and status != "FOUND":
                    reason = f"{status} (no progress)"
                    break
                offset = res.nextBeginOffset
            done = {"event": "queue_done", "queue_id": mq.queueId, "broker": mq.brokerName.decode(),
                    "next": offset, "reason": reason}
            queues_done.append(done)
            c.emit(done)
    finally:
        if size.value:
            dll.ReleaseSubscriptionMessageQueue(mqs)
        failed = [q for q in queues_done if q["reason"] != "NO_NEW_MSG"]
        c.emit({"event": "summary", "role": "pull_consumer", "received": received,
                "queues": len(queues_done), "errors": errors,
                "failed_queues": [q["queue_id"] for q in failed],
                "elapsed_s": round(time.monotonic() - t_start, 3)})
        c.shutdown_and_destroy(consumer, "PullConsumer", t_start)
    return c.EXIT_FAILURES if failed else c.EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
