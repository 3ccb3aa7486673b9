"""Transactions with the official RocketMQ C++ client (PyPI ``rocketmq==0.4.4``) and a real ``cometmq serve``.

The wheel has no transaction producer (no Python class, no ``CreateTransactionProducer`` in its C API — that came
with rocketmq-client-cpp 1.2.4), so it cannot commit or roll back. What it can show, and these tests check:

- its plain producer sending ``TRAN_MSG=true`` makes a half; our CHECK_TRANSACTION_STATE reaches it and its
  C++ code decodes header and message (its log prints them), then refuses with "producer not
  TransactionMQProducer" — no crash, no answer — so after ``transactionCheckMax`` checks the half goes to
  TRANS_CHECK_MAX_TIME_TOPIC, where the C++ consumer reads it; the real topic never sees it;
- its consumers receive what our SDK's TransactionProducer commits (commit, check-back commit, and a half still
  pending across a kill -9 of the broker) exactly once, with the UNIQ_KEY as message id, and never what was
  rolled back.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cometmq.client import LocalTransactionState, Message, MessageExt, TransactionClientInstance, TransactionProducer
from tests.interop.cometmq_server import CometServer
from tests.interop.harness import CppClientRunner

S = LocalTransactionState
Server = Callable[..., CometServer]


def pull_msgs(cpp: CppClientRunner, server: CometServer, topic: str) -> list[dict[str, Any]]:
    res = cpp.run("pull_consume", namesrv=server.namesrv, topic=topic)
    assert res.returncode == 0 or res.aborted_in_shutdown, res.describe() + "\n" + server.log_tail()
    assert res.summary is not None and not res.summary["failed_queues"], res.describe()
    return res.events("msg")


def test_the_wheel_has_no_transaction_producer(cpp_client: CppClientRunner) -> None:
    res = cpp_client.run("cpp_transaction_produce")
    [caps] = res.events("capabilities")
    assert caps == {"event": "capabilities", "python_class": False, "c_api": False, "cpp_class_symbols": True}


def test_cpp_half_is_checked_then_moved_to_the_check_max_topic(cpp_client: CppClientRunner,
                                                                cometmq_server: Server, tmp_path: Path) -> None:
    server = cometmq_server({"transactionTimeOut": "1000", "transactionCheckInterval": "700",
                             "transactionCheckMax": "3"})
    server.create_topic("CppTxHalf", 2)
    res = cpp_client.run("cpp_transaction_produce", namesrv=server.namesrv, topic="CppTxHalf", count=1,
                         linger=10, log_level="info")
    assert res.returncode == 0 or res.aborted_in_shutdown, res.describe()
    [sent] = res.events("sent")
    assert sent["status"] == "OK"
    log = "".join(p.read_text(errors="replace") for p in res.log_files())
    # The C++ client decoded every check (header fields and the half message) and refused it.
    checks = re.findall(r"CheckTransactionStateRequestHeader: msgId:(\w+) transactionId:(\w+) offsetMsgId:(\w+) "
                        r"commitLogOffset:(\d+) tranStateTableOffset:(\d+)", log)
    assert len(checks) == 3, log[-3000:]
    assert {c[0] for c in checks} == {sent["msg_id"]} and {c[1] for c in checks} == {sent["msg_id"]}
    assert [int(c[4]) for c in checks] == [1, 2, 3]  # each check names the re-appended half
    assert log.count("producer not TransactionMQProducer") == 3
    assert "moved to TRANS_CHECK_MAX_TIME_TOPIC" in server.log_text()
    assert pull_msgs(cpp_client, server, "CppTxHalf") == []
    [kept] = pull_msgs(cpp_client, server, "TRANS_CHECK_MAX_TIME_TOPIC")
    assert kept["msg_id"] == sent["msg_id"] and kept["keys"] == "cpp-tx-0" and kept["body"] == "cpp-half-0"


async def test_cpp_consumer_gets_each_commit_once_across_a_kill_9(cpp_client: CppClientRunner,
                                                                   cometmq_server: Server) -> None:
    server = cometmq_server({"transactionTimeOut": "1000", "transactionCheckInterval": "500",
                             "transactionCheckMax": "30"})
    await asyncio.to_thread(server.create_topic, "CppTxSdk", 2)
    decide = asyncio.Event()

    def checker(msg: MessageExt) -> LocalTransactionState:
        if msg.body == b"rolled-back-by-check":
            return S.ROLLBACK
        return S.COMMIT if decide.is_set() or msg.body == b"checked" else S.UNKNOW

    instance = TransactionClientInstance(server.namesrv, heartbeat_interval=0.5)
    async with TransactionProducer("tx-cpp", instance=instance, checker=checker) as p:
        sent = {}
        for body, state in ((b"committed", S.COMMIT), (b"rolled-back", S.ROLLBACK), (b"checked", S.UNKNOW),
                            (b"rolled-back-by-check", S.UNKNOW), (b"across-the-crash", S.UNKNOW)):
            r = await p.send_in_transaction(Message("CppTxSdk", body, keys=f"k-{body.decode()}", tags="tx"),
                                            lambda m, a, s=state: s)
            sent[body.decode()] = r.msg_id
        async with asyncio.timeout(30):
            while p.checks_answered[S.COMMIT] == 0 or p.checks_answered[S.ROLLBACK] == 0:
                await asyncio.sleep(0.05)
        await asyncio.to_thread(server.restart, hard=True)
        decide.set()
        async with asyncio.timeout(60):
            while p.checks_answered[S.COMMIT] < 2:
                await asyncio.sleep(0.05)
    msgs = await asyncio.to_thread(pull_msgs, cpp_client, server, "CppTxSdk")
    got = sorted((m["body"], m["msg_id"], m["keys"], m["tags"]) for m in msgs)
    want = sorted((b, sent[b], f"k-{b}", "tx") for b in ("committed", "checked", "across-the-crash"))
    assert got == want
