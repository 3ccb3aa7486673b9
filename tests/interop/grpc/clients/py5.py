"""Drive the official RocketMQ 5.x Python client (rocketmq-python-client, in .venv-py5) against a gRPC endpoint.

Run with .venv-py5/bin/python (never with cometmq's own venv: the client ships its own generated protos).
Prints one JSON object per stdout line with an ``event`` key. Subcommands:

  produce        --count N [--tag T] [--keys K] [--group G (FIFO)] [--delay-ms D] [--prefix P]
                 [--keep-going (a failed send prints ``failed`` and the loop goes on)] [--interval-ms I]
                 [--duration S (stop sending after S seconds; SIGTERM stops too)]
  transaction    --decision commit|rollback|unknown --check commit|rollback|unknown [--linger S]
  recall         --handle H
  simple         --group G --count N [--invisible S] [--sql EXPR | --tag-expr EXPR] [--no-ack]
                 [--change-invisible S (on the first delivery)] [--timeout S]
  push           --group G --count N [--fail-first N] [--sql EXPR | --tag-expr EXPR] [--timeout S]

Common: --endpoints host:port --topic T [--ak AK --sk SK] [--tls (the client's tls_enable: a secure channel; the
CA comes from GRPC_DEFAULT_SSL_ROOTS_FILE_PATH, grpc.ssl_channel_credentials() takes no other)]
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time

from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)
from rocketmq.grpc_protocol import FilterType

RESOLUTIONS = {"commit": TransactionResolution.COMMIT, "rollback": TransactionResolution.ROLLBACK,
               "unknown": TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED}


_out = threading.Lock()


def emit(event: str, **fields: object) -> None:
    line = json.dumps({"event": event, **fields}) + "\n"
    with _out:  # consumer threads print concurrently: one whole line at a time
        sys.stdout.write(line)
        sys.stdout.flush()


def config(args: argparse.Namespace) -> ClientConfiguration:
    return ClientConfiguration(args.endpoints, Credentials(args.ak, args.sk), request_timeout=args.request_timeout)


def filter_of(args: argparse.Namespace) -> FilterExpression:
    if args.sql:
        return FilterExpression(args.sql, FilterType.SQL)
    return FilterExpression(args.tag_expr or "*")


def describe(m: Message) -> dict[str, object]:
    return {"id": m.message_id, "body": m.body.decode("utf-8", "replace"), "tag": m.tag, "keys": sorted(m.keys),
            "group": m.message_group, "attempt": m.delivery_attempt, "properties": dict(m.properties or {}),
            "topic": m.topic}


def produce(args: argparse.Namespace) -> None:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    end = time.monotonic() + args.duration if args.duration else float("inf")
    producer = Producer(config(args), (args.topic,), tls_enable=args.tls)
    producer.startup()
    try:
        for i in range(args.count):
            if stop.is_set() or time.monotonic() >= end:
                break
            if i and args.interval_ms:
                time.sleep(args.interval_ms / 1000)
            msg = Message()
            msg.topic = args.topic
            msg.body = f"{args.prefix}{i}".encode()
            if args.tag:
                msg.tag = args.tag
            if args.keys:
                msg.keys = args.keys
            if args.group:
                msg.message_group = args.group
            if args.delay_ms:
                msg.delivery_timestamp = int(time.time() * 1000) + args.delay_ms
            msg.add_property("index", str(i))
            t0 = time.monotonic()
            try:
                receipt = producer.send(msg)
            except Exception as exc:
                if not args.keep_going:
                    raise
                emit("failed", index=i, body=msg.body.decode(), type=type(exc).__name__, message=str(exc)[:300],
                     elapsed_ms=round((time.monotonic() - t0) * 1000, 1), t=time.time())
                continue
            emit("sent", id=receipt.message_id, offset=receipt.offset, recall_handle=receipt.recall_handle or "",
                 body=msg.body.decode(), t=time.time())
    finally:
        producer.shutdown()


class Checker(TransactionChecker):  # type: ignore[misc]
    def __init__(self, answer: str) -> None:
        self.answer = answer

    def check(self, message: Message) -> TransactionResolution:
        emit("checked", id=message.message_id, body=message.body.decode(), answer=self.answer)
        return RESOLUTIONS[self.answer]


def transaction(args: argparse.Namespace) -> None:
    producer = Producer(config(args), (args.topic,), checker=Checker(args.check), tls_enable=args.tls)
    producer.startup()
    try:
        tx = producer.begin_transaction()
        msg = Message()
        msg.topic = args.topic
        msg.body = f"{args.prefix}tx".encode()
        receipt = producer.send(msg, tx)
        emit("half-sent", id=receipt.message_id)
        if args.decision == "commit":
            tx.commit()
        elif args.decision == "rollback":
            tx.rollback()
        emit("decided", decision=args.decision)
        time.sleep(args.linger)
    finally:
        producer.shutdown()


def recall(args: argparse.Namespace) -> None:
    producer = Producer(config(args), (args.topic,), tls_enable=args.tls)
    producer.startup()
    try:
        emit("recalled", id=producer.recall_message(args.topic, args.handle))
    finally:
        producer.shutdown()


def simple(args: argparse.Namespace) -> None:
    consumer = SimpleConsumer(config(args), args.group, {args.topic: filter_of(args)}, await_duration=args.await_s,
                              tls_enable=args.tls)
    consumer.startup()
    got = 0
    changed: set[str] = set()
    deadline = time.monotonic() + args.timeout
    try:
        while got < args.count and time.monotonic() < deadline:
            for m in consumer.receive(args.batch, args.invisible) or []:
                emit("received", **describe(m))
                if args.change_invisible is not None and m.message_id not in changed:
                    changed.add(m.message_id)
                    consumer.change_invisible_duration(m, args.change_invisible)
                    emit("changed", id=m.message_id)
                    continue
                if not args.no_ack:
                    consumer.ack(m)
                    emit("acked", id=m.message_id)
                got += 1
    finally:
        consumer.shutdown()
    emit("done", received=got)


class Listener(MessageListener):  # type: ignore[misc]
    def __init__(self, fail_first: int) -> None:
        self.fail_first = fail_first
        self.seen = 0
        self.lock = threading.Lock()
        self.ok = 0

    def consume(self, message: Message) -> ConsumeResult:
        with self.lock:
            self.seen += 1
            fail = self.seen <= self.fail_first
            if not fail:
                self.ok += 1
        emit("consumed", ok=not fail, **describe(message))
        return ConsumeResult.FAILURE if fail else ConsumeResult.SUCCESS


def push(args: argparse.Namespace) -> None:
    listener = Listener(args.fail_first)
    consumer = PushConsumer(config(args), args.group, listener, {args.topic: filter_of(args)},
                            consumption_thread_count=args.threads, tls_enable=args.tls)
    consumer.startup()
    emit("started")
    deadline = time.monotonic() + args.timeout
    try:
        while listener.ok < args.count and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        consumer.shutdown()
    emit("done", received=listener.ok)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("command", choices=["produce", "transaction", "recall", "simple", "push"])
    p.add_argument("--endpoints", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--ak", default="")
    p.add_argument("--tls", action="store_true")
    p.add_argument("--sk", default="")
    p.add_argument("--request-timeout", type=float, default=3)
    p.add_argument("--count", type=int, default=1)
    p.add_argument("--prefix", default="msg-")
    p.add_argument("--tag")
    p.add_argument("--keys")
    p.add_argument("--group")
    p.add_argument("--delay-ms", type=int, default=0)
    p.add_argument("--decision", default="commit")
    p.add_argument("--check", default="commit")
    p.add_argument("--linger", type=float, default=0)
    p.add_argument("--handle")
    p.add_argument("--invisible", type=int, default=10)
    p.add_argument("--change-invisible", type=int)
    p.add_argument("--no-ack", action="store_true")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--await-s", type=int, default=5)
    p.add_argument("--sql")
    p.add_argument("--tag-expr")
    p.add_argument("--fail-first", type=int, default=0)
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--timeout", type=float, default=30)
    p.add_argument("--keep-going", action="store_true")
    p.add_argument("--interval-ms", type=float, default=0)
    p.add_argument("--duration", type=float, default=0)
    args = p.parse_args()
    try:
        {"produce": produce, "transaction": transaction, "recall": recall, "simple": simple, "push": push}[
            args.command](args)
    except Exception as exc:
        emit("error", type=type(exc).__name__, message=str(exc))
        sys.exit(2)


if __name__ == "__main__":
    main()
