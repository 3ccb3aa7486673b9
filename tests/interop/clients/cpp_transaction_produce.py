"""What the RocketMQ C++ client (PyPI ``rocketmq==0.4.4``) can do with transactions.

1. Reports whether the wheel offers a transaction producer at all::

       {"event":"capabilities","python_class":false,"c_api":false,"cpp_class_symbols":true}

   ``python_class``: ``rocketmq.client.TransactionMQProducer`` exists; ``c_api``: the bundled library exports
   ``CreateTransactionProducer`` (rocketmq-client-cpp >= 1.2.4's C API); ``cpp_class_symbols``: the C++ class
   ``rocketmq::TransactionMQProducer`` is compiled in (its mangled methods are exported).

2. With ``--count N`` (> 0), sends N messages with the plain ``Producer`` and the ``TRAN_MSG=true`` property —
   what a RocketMQ broker takes as a transaction's half — then stays connected ``--linger`` seconds so that the
   broker's CHECK_TRANSACTION_STATE requests reach it, and shuts down. Lines: ``sent`` per message (as
   produce.py), ``lingered``, ``summary``, ``closed``.
"""

from __future__ import annotations

import argparse
import ctypes
import time

import _common as c


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--namesrv", default="")
    ap.add_argument("--topic", default="")
    ap.add_argument("--group", default="PG_cpp_tx")
    ap.add_argument("--count", type=int, default=0)
    ap.add_argument("--linger", type=float, default=0.0, help="seconds to stay connected after sending")
    ap.add_argument("--log-level", choices=sorted(c.LOG_LEVELS), default=None)
    return ap.parse_args(argv)


def capabilities(client: object) -> dict[str, bool]:
    lib = c.dll()
    c_api = hasattr(lib, "CreateTransactionProducer")
    # A mangled member of rocketmq::TransactionMQProducer (sendMessageInTransaction(MQMessage&, void*)).
    cpp = hasattr(lib, "_ZN8rocketmq21TransactionMQProducer24sendMessageInTransactionERNS_9MQMessageEPv")
    return {"python_class": hasattr(client, "TransactionMQProducer"), "c_api": c_api, "cpp_class_symbols": cpp}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    client = c.load_wheel()
    c.emit({"event": "capabilities", **capabilities(client)})
    if args.count <= 0:
        return c.EXIT_OK
    producer = client.Producer(args.group)
    producer.set_namesrv_addr(args.namesrv)
    c.set_log_level("Producer", producer._handle, args.log_level)
    t_start = time.monotonic()
    producer.start()
    c.emit({"event": "started", "role": "producer", **c.pid_info()})
    sent = failed = 0
    try:
        for i in range(args.count):
            msg = client.Message(args.topic)
            body = f"cpp-half-{i}".encode()
            c.dll().SetByteMessageBody(msg._handle, ctypes.c_char_p(body), len(body))
            msg.set_keys(f"cpp-tx-{i}")
            msg.set_property("TRAN_MSG", "true")
            try:
                res = producer.send_sync(msg)
            except Exception as exc:
                failed += 1
                c.emit({"event": "error", "index": i, "error": f"{type(exc).__name__}: {exc}"})
                continue
            sent += 1
            c.emit({"event": "sent", "index": i, "status": res.status.name, "msg_id": res.msg_id,
                    "queue_offset": res.offset, "keys": f"cpp-tx-{i}"})
        time.sleep(args.linger)
        c.emit({"event": "lingered", "seconds": args.linger})
    finally:
        c.emit({"event": "summary", "role": "producer", "sent": sent, "failed": failed,
                "elapsed_s": round(time.monotonic() - t_start, 3)})
        c.shutdown_and_destroy(producer, "Producer", t_start)
    return c.EXIT_OK if failed == 0 else c.EXIT_FAILURES


if __name__ == "__main__":
    raise SystemExit(main())
