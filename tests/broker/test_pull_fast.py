"""The fast answer to a woken pull (broker/pull_fast.py) against the generic replay it short-cuts: two brokers in
lockstep (same clock, same store host), one with the fast answer, the other without, fed the same pulls (held
at the queue's end, or anywhere), the same changes while they wait and the same sends that wake them. Whatever
the pull, the change and the sends: the same answer bytes, the same stats and the same held pulls left."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from cometmq.broker.controller import BrokerController
from cometmq.broker.long_polling import HeldPull
from cometmq.net.client import RemotingClient
from cometmq.net.connection import RemotingConnection
from cometmq.net.local import connect_local
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.message import iter_records, pack_host
from cometmq.protocol.remoting import RemotingCommand, SerializeType, encode
from cometmq.protocol.route import PERM_WRITE, TopicConfig
from cometmq.store.message import DispatchRequest
from tests.kit import FakeClock
from tests.kit.transport import MemoryTransport

from .conftest import StartBroker, broker_config, props, pull_request, send_request

STORE_HOST = pack_host("10.1.2.3", 10911)


class Side:
    """One broker, a consumer's connection and a producer's."""

    def __init__(self, broker: BrokerController, fast: bool) -> None:
        self.broker = broker
        self.consumer = MemoryTransport(("192.168.5.6", 40000))
        self.producer = MemoryTransport(("192.168.5.7", 40001))
        self.cconn = self._conn(self.consumer)
        self.pconn = self._conn(self.producer)
        self.taken: list[bool] = []
        inner = broker.hold.fast_replay
        assert inner is not None
        if fast:
            def spy(held: HeldPull, req: DispatchRequest) -> bool:
                took = inner(held, req)
                self.taken.append(took)
                return took
            broker.hold.fast_replay = spy
        else:
            broker.hold.fast_replay = None

    def _conn(self, sink: MemoryTransport) -> RemotingConnection:
        conn: RemotingConnection = self.broker.server._new_connection()  # type: ignore[union-attr]
        conn.connection_made(sink)  # type: ignore[arg-type]
        return conn

    async def run(self, pull: bytes, change: Callable[[BrokerController], None], sends: list[bytes]) -> list[bytes]:
        before = len(self.consumer.written)
        self.cconn.data_received(pull)
        await asyncio.sleep(0)
        change(self.broker)
        for frame in sends:
            self.pconn.data_received(frame)
            await asyncio.sleep(0)
        for _ in range(5):
            await asyncio.sleep(0.001)
        return self.consumer.written[before:]

    def state(self) -> tuple[Any, ...]:
        stats = self.broker.stats
        held = sorted((h.topic, h.queue_id, h.offset) for hs in self.broker.hold._table.values() for h in hs)
        return dict(stats.messages_out), dict(stats.pulled), held, self.broker.hold.woken_by_arrival


async def start_pair(tmp: Path, **changes: Any) -> tuple[Side, Side]:
    sides = []
    for name, fast in (("fast", True), ("generic", False)):
        # (no held pull times out or meets the hold service's safety check during a test: those come at moments
        # that differ between the two brokers)
        b = BrokerController(broker_config(tmp / name, hold_check_interval_ms=3_600_000, **changes),
                             clock=FakeClock())
        await b.start()
        b.store.commitlog.store_host = STORE_HOST
        b.topics.put(TopicConfig("T", read_queue_nums=2, write_queue_nums=2))
        b.topics.put(TopicConfig("U", read_queue_nums=1, write_queue_nums=1))
        sides.append(Side(b, fast))
    return sides[0], sides[1]


def run_pair(tmp: Path, check: Callable[[Side, Side, asyncio.AbstractEventLoop], None], **changes: Any) -> None:
    loop = asyncio.new_event_loop()
    try:
        fast, generic = loop.run_until_complete(start_pair(tmp, **changes))
        try:
            check(fast, generic, loop)
        finally:
            for side in (fast, generic):
                side.cconn.connection_lost(None)
                side.pconn.connection_lost(None)
                loop.run_until_complete(side.broker.stop())
    finally:
        loop.close()


def _no_change(broker: BrokerController) -> None:
    pass


def _read_only_broker(broker: BrokerController) -> None:
    broker.pull_processor.config = broker.config.replace(broker_permission=PERM_WRITE)


def _unreadable_topic(broker: BrokerController) -> None:
    broker.topics.put(TopicConfig("T", read_queue_nums=2, write_queue_nums=2, perm=PERM_WRITE))


def _fewer_read_queues(broker: BrokerController) -> None:
    broker.topics.put(TopicConfig("T", read_queue_nums=1, write_queue_nums=2))


def _group_may_not_consume(broker: BrokerController) -> None:
    cfg = broker.groups.find("cg")
    assert cfg is not None
    broker.groups.groups["cg"] = dataclasses.replace(cfg, consumeEnable=False)


def _readable_again(broker: BrokerController) -> None:
    broker.pull_processor.config = broker.config


CHANGES = [_no_change, _read_only_broker, _unreadable_topic, _fewer_read_queues, _group_may_not_consume]


Case = tuple[dict[str, Any], int, SerializeType, Callable[[BrokerController], None], list[bytes], int]


@st.composite
def cases(draw: st.DrawFn) -> Case:
    """(a pull's fields, its opaque and serialize type, a change while it waits, the sends after it, where it
    pulls from against the queue's end): mostly a plain long poll at the end of its queue woken by one send to
    it, now and then anything else."""

    def mostly(good: Any, other: st.SearchStrategy[Any]) -> Any:
        return good if draw(st.integers(0, 5)) else draw(other)

    topic = mostly("T", st.sampled_from(["U", "NoSuch"]))
    queue_id = draw(st.integers(0, 1))
    subscription = mostly("*", st.sampled_from(["", "a", "a || b", "b", "a || *", None]))
    ext: dict[str, Any] = {"consumerGroup": mostly("cg", st.just("cg2")), "topic": topic, "queueId": queue_id,
                           "maxMsgNums": mostly(32, st.sampled_from([1, 0, -1])),
                           "sysFlag": mostly(6, st.sampled_from([2, 3, 7, 0, 4])), "commitOffset": "0",
                           "subVersion": "0", "suspendTimeoutMillis": "600000"}
    if subscription is not None:
        ext["subscription"] = subscription
    ext_type = mostly(None, st.sampled_from(["TAG", "tag", "SQL92", "XYZ"]))
    if ext_type is not None:
        ext["expressionType"] = ext_type
    sends = []
    for _ in range(mostly(1, st.integers(0, 3))):
        tags = draw(st.sampled_from(["a", "b", ""]))
        sends.append(encode(send_request(mostly(topic if topic != "NoSuch" else "T", st.sampled_from(["T", "U"])),
                                         draw(st.binary(max_size=40)), mostly(queue_id, st.integers(0, 1)),
                                         props(TAGS=tags) if tags else "")))
    return (ext, draw(st.integers(0, 2**31 - 1)), mostly(SerializeType.JSON, st.just(SerializeType.ROCKETMQ)),
            mostly(_no_change, st.sampled_from(CHANGES)), sends, mostly(0, st.sampled_from([-1, 1, 5])))


def compare(fast: Side, generic: Side, loop: asyncio.AbstractEventLoop, ext: dict[str, Any], opaque: int,
            stype: SerializeType, change: Callable[[BrokerController], None], sends: list[bytes], shift: int) -> bool:
    """Whether the fast answer took the pull."""
    taken = len(fast.taken)
    answers = []
    for side in (fast, generic):
        topic = ext["topic"] if ext["topic"] != "NoSuch" else "T"
        end = side.broker.store.max_offset(topic, ext["queueId"])
        fields = {**ext, "queueOffset": str(max(0, end + shift))}
        pull = RemotingCommand(RequestCode.PULL_MESSAGE, opaque=opaque, ext_fields=fields, serialize_type=stype)
        answers.append(loop.run_until_complete(side.run(encode(pull), change, sends)))
        _readable_again(side.broker)
        side.broker.topics.put(TopicConfig("T", read_queue_nums=2, write_queue_nums=2))
        cfg = side.broker.groups.find("cg")
        assert cfg is not None
        side.broker.groups.groups["cg"] = dataclasses.replace(cfg, consumeEnable=True)
    assert answers[0] == answers[1]
    assert fast.state() == generic.state()
    return any(fast.taken[taken:])


def test_fast_answer_is_the_generic_answer(tmp_path: Path) -> None:
    def check(fast: Side, generic: Side, loop: asyncio.AbstractEventLoop) -> None:
        @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
        @given(cases())
        def one(case: Case) -> None:
            event("fast" if compare(fast, generic, loop, *case) else "generic")

        one()
        assert any(fast.taken) and not all(fast.taken)

    run_pair(tmp_path, check)


def test_a_woken_long_poll_is_answered_at_once(tmp_path: Path) -> None:
    """The common case, step by step: held at the end, woken by one send, answered from the template (the answer
    in the sends' loop turn), the stats counted once, nothing left held; the observer hears of it as held."""
    def check(fast: Side, generic: Side, loop: asyncio.AbstractEventLoop) -> None:
        heard: list[tuple[int, int, bool]] = []
        fast.cconn.observer = fast.cconn._observer = lambda req, resp, ns, held: heard.append((req, resp, held))
        generic.cconn.observer = generic.cconn._observer = lambda req, resp, ns, held: None
        ext = {"consumerGroup": "cg", "topic": "T", "queueId": 1, "maxMsgNums": 32, "sysFlag": 6,
               "commitOffset": "0", "subVersion": "0", "suspendTimeoutMillis": "600000", "subscription": "*"}
        for i in range(5):
            send = encode(send_request("T", b"m%d" % i, 1, props(TAGS="a")))
            assert compare(fast, generic, loop, ext, 100 + i, SerializeType.JSON, _no_change, [send], 0)
        assert fast.taken == [True] * 5
        assert [h for h in heard if h[0] == RequestCode.PULL_MESSAGE] == [
            (RequestCode.PULL_MESSAGE, ResponseCode.SUCCESS, True)] * 5
        assert fast.broker.hold.held_count == 0

    run_pair(tmp_path, check)


def test_a_failing_fast_answer_leaves_the_pull_to_the_generic_replay(tmp_path: Path) -> None:
    def check(fast: Side, generic: Side, loop: asyncio.AbstractEventLoop) -> None:
        def broken(offset: int, size: int) -> memoryview | None:
            raise RuntimeError("boom")

        fast.broker.pull_processor.store.commitlog.read = broken  # type: ignore[method-assign]
        generic.broker.pull_processor.store.commitlog.read = broken  # type: ignore[method-assign]
        ext = {"consumerGroup": "cg", "topic": "T", "queueId": 0, "maxMsgNums": 32, "sysFlag": 6,
               "commitOffset": "0", "subVersion": "0", "suspendTimeoutMillis": "600000", "subscription": "*"}
        send = encode(send_request("T", b"m", 0))
        assert not compare(fast, generic, loop, ext, 7, SerializeType.JSON, _no_change, [send], 0)
        assert fast.taken == [False]
        assert b"boom" in fast.consumer.written[-1]  # the generic replay's SYSTEM_ERROR, as on the other side

    run_pair(tmp_path, check)


def test_the_answer_leaves_before_the_held_pull_is_forgotten(tmp_path: Path) -> None:
    """The consumer waits for the answer, not for the hold service's bookkeeping: when the fast answer takes a
    woken pull, the answer is written first, then the pull's timer is cancelled and its table entries go."""
    def check(fast: Side, generic: Side, loop: asyncio.AbstractEventLoop) -> None:
        hold = fast.broker.hold
        unlink = hold._unlink
        seen: list[tuple[bool, bool, bool]] = []

        def spy(held: HeldPull) -> None:
            last = fast.consumer.written[-1] if fast.consumer.written else b""
            answered = held.request.opaque == 41 and b'"nextBeginOffset"' in last
            unlink(held)
            assert held.timer is not None
            seen.append((held.done, answered, held.timer.cancelled()))

        hold._unlink = spy  # type: ignore[method-assign]
        ext = {"consumerGroup": "cg", "topic": "T", "queueId": 0, "maxMsgNums": 32, "sysFlag": 6,
               "commitOffset": "0", "subVersion": "0", "suspendTimeoutMillis": "600000", "subscription": "*"}
        assert compare(fast, generic, loop, ext, 41, SerializeType.JSON, _no_change,
                       [encode(send_request("T", b"m", 0))], 0)
        assert seen == [(True, True, True)]
        assert hold.held_count == 0

    run_pair(tmp_path, check)


def test_a_fast_answer_that_raises_still_lets_go_of_the_pull(tmp_path: Path) -> None:
    """A bug in the fast answer (it raises past its own guard): the store logs the failing arrival listener, and the
    pull is forgotten all the same (its timer cancelled, nothing left held), not kept until its connection closes."""
    def check(fast: Side, generic: Side, loop: asyncio.AbstractEventLoop) -> None:
        hold = fast.broker.hold
        woken: list[HeldPull] = []

        def broken(held: HeldPull, req: DispatchRequest) -> bool:
            woken.append(held)
            raise RuntimeError("a bug")

        hold.fast_replay = broken
        ext = {"consumerGroup": "cg", "topic": "T", "queueId": 0, "maxMsgNums": 32, "sysFlag": 6,
               "commitOffset": "0", "subVersion": "0", "suspendTimeoutMillis": "600000", "subscription": "*",
               "queueOffset": str(fast.broker.store.max_offset("T", 0))}
        pull = RemotingCommand(RequestCode.PULL_MESSAGE, opaque=9, ext_fields=ext)
        loop.run_until_complete(fast.run(encode(pull), _no_change, [encode(send_request("T", b"m", 0))]))
        assert len(woken) == 1 and woken[0].done
        assert woken[0].timer is not None and woken[0].timer.cancelled()
        assert hold.held_count == 0 and not hold._by_conn.get(fast.cconn)

    run_pair(tmp_path, check)


async def test_a_pull_held_on_an_in_process_connection_is_answered(start_broker: StartBroker,
                                                                   client: RemotingClient) -> None:
    """The gRPC endpoint embedded in ``cometmq serve`` pulls over an in-process connection (net/local.py): a fast
    answer reaches it as the command it encodes. (It was dropped as if the peer had gone, and the pull forgotten:
    the consumer's request timed out.)"""
    b = await start_broker()
    assert (await client.invoke(b.addr, send_request("T", b"first"), 5)).code == ResponseCode.SUCCESS
    inner = b.hold.fast_replay
    assert inner is not None
    taken: list[bool] = []
    b.hold.fast_replay = lambda held, req: taken.append(inner(held, req)) or taken[-1]
    conn = connect_local(b.server, None)  # type: ignore[arg-type]
    pull = asyncio.ensure_future(conn.request(pull_request("T", b.store.max_offset("T", 0), suspend_ms=3000), 5))
    while b.hold.held_count == 0:
        await asyncio.sleep(0.01)
    assert (await client.invoke(b.addr, send_request("T", b"second"), 5)).code == ResponseCode.SUCCESS
    answer = await pull
    assert answer.code == ResponseCode.SUCCESS and [r.body for r in iter_records(answer.body)] == [b"second"]
    assert taken == [True] and b.hold.held_count == 0
    conn.close()
