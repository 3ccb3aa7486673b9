"""The fast path of a lone single send (broker/send_fast.py) against the generic path it short-cuts: two brokers in
lockstep (same clock, same store host, same random queue picks), one serving through the fast path, the other with
it turned off on its connection, fed the same frames. For any send, plain or not, well-formed or not: the same
reply bytes, the same commit log bytes, the same consume queues and the same send stats."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from cometmq.broker.controller import BrokerController
from cometmq.client.message import Message
from cometmq.client.producer import Producer
from cometmq.net.connection import RemotingConnection
from cometmq.protocol.client_bodies import MessageQueue
from cometmq.protocol.codes import RequestCode
from cometmq.protocol.headers import V2_KEYS
from cometmq.protocol.message import pack_host
from cometmq.protocol.remoting import RemotingCommand, SerializeType, encode, encode_parts
from cometmq.protocol.route import PERM_READ, TopicConfig
from cometmq.store.config import FlushDiskType
from tests.kit import FakeClock
from tests.kit.transport import MemoryTransport

from .conftest import broker_config, props

STORE_HOST = pack_host("10.1.2.3", 10911)
TEXT = st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), max_size=12)
PROPS = st.dictionaries(st.one_of(st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "WAIT", "__SHARDINGKEY", "DELAY",
                                                   "TIMER_DELAY_SEC", "TRAN_MSG", "PGROUP", "ü-名"]), TEXT),
                        TEXT, max_size=5)
INT_TEXT = st.one_of(st.integers(-5, 2**40).map(str), st.sampled_from(["abc", " 1", "+1", "1_0", "", "007", "-0",
                                                                      "1" * 20]))


class Side:
    """One broker and a connection to feed."""

    def __init__(self, broker: BrokerController, fast: bool) -> None:
        self.broker = broker
        self.sink = MemoryTransport(("192.168.5.6", 40000))
        self.conn: RemotingConnection = broker.server._new_connection()  # type: ignore[union-attr]
        self.conn.connection_made(self.sink)  # type: ignore[arg-type]
        #: per chunk offered to the fast path: whether it took all of it
        self.taken: list[bool] = []
        #: per chunk offered: how many bytes it took
        self.took: list[int] = []
        #: milliseconds to wait for a reply (none comes to a oneway request)
        self.patience = 20 if broker.config.store.flush_disk_type is FlushDiskType.ASYNC_FLUSH else 500
        inner = self.conn._fast_path
        assert inner is not None
        if fast:
            def spy(conn: RemotingConnection, data: bytes) -> int:
                took = inner(conn, data)
                self.taken.append(took == len(data))
                self.took.append(took)
                return took
            self.conn._fast_path = spy
        else:
            self.conn._fast_path = None

    async def feed(self, frame: bytes, seed: int) -> bytes | None:
        before = len(self.sink.written)
        random.seed(seed)
        self.conn.data_received(frame)
        for _ in range(self.patience):
            if len(self.sink.written) > before:
                break
            await asyncio.sleep(0.001)
        assert len(self.sink.written) <= before + 1
        return self.sink.written[before] if len(self.sink.written) > before else None

    async def feed_chunks(self, chunks: list[bytes], seed: int) -> list[bytes]:
        """Feed ``chunks`` in one go; the replies that came until none came for ``patience`` ms."""
        before = len(self.sink.written)
        random.seed(seed)
        for chunk in chunks:
            self.conn.data_received(chunk)
        seen, quiet = before, 0
        while quiet < self.patience:
            await asyncio.sleep(0.001)
            quiet = 0 if len(self.sink.written) > seen else quiet + 1
            seen = len(self.sink.written)
        return self.sink.written[before:]

    def state(self) -> tuple[Any, ...]:
        store = self.broker.store
        segments = [bytes(mf.mm[:mf.wrote_position]) for mf in store.commitlog.files.files]  # type: ignore[index]
        queues = {key: [cq.get_unit(i) for i in range(cq.min_offset, cq.max_offset)]
                  for key, cq in sorted(store.queues.items())}
        return segments, queues, self.broker.stats.messages_in, store.commitlog.queue_table


async def start_pair(tmp: Path, **changes: Any) -> tuple[Side, Side]:
    sides = []
    for name, fast in (("fast", True), ("generic", False)):
        b = BrokerController(broker_config(tmp / name, **changes), clock=FakeClock())
        await b.start()
        b.store.commitlog.store_host = STORE_HOST
        b.topics.put(TopicConfig("T", read_queue_nums=4, write_queue_nums=4))
        b.topics.put(TopicConfig("T2", read_queue_nums=2, write_queue_nums=2))
        b.topics.put(TopicConfig("ReadOnly", read_queue_nums=2, write_queue_nums=2, perm=PERM_READ))
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
                side.conn.connection_lost(None)
                loop.run_until_complete(side.broker.stop())
    finally:
        loop.close()


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    """Sends of every kind: mostly plain and well-formed, each field now and then otherwise."""

    def mostly(good: Any, other: st.SearchStrategy[Any]) -> Any:
        return good if draw(st.integers(0, 15)) else draw(other)

    ext: dict[str, Any] = {
        "a": mostly("pg", st.sampled_from(["", None])),
        "b": mostly("T", st.sampled_from(["T2", "NoSuchTopic", "ReadOnly", "%RETRY%grp", "%DLQ%grp",
                                          "SCHEDULE_TOPIC_XXXX", "TBW102", "bad topic", "", "x" * 130, None])),
        "c": mostly("TBW102", st.none()),
        "d": mostly("4", st.sampled_from(["x", None])),
        "e": draw(st.one_of(st.sampled_from(["-1", "0", "1", "3"]), st.sampled_from(["4", "9", None]), INT_TEXT)),
        "f": mostly("0", st.sampled_from(["1", "2", "4", "8", "12", "abc", None])),
        "g": mostly(str(draw(st.integers(0, 2**42))), st.one_of(INT_TEXT, st.none())),
        "h": mostly(str(draw(st.integers(-5, 2**31))), st.one_of(INT_TEXT, st.none())),
        "i": props(**draw(PROPS)) if draw(st.integers(0, 9)) else draw(st.sampled_from(["", "\udc80", None])),
        "j": mostly("0", st.sampled_from(["3", "x", None])),
        "k": mostly("false", st.sampled_from(["true", "1", "maybe", None])),
        "l": mostly(None, st.sampled_from(["16", "x"])),
        "m": mostly("false", st.sampled_from(["0", "", "true", "1", "FALSE", " false", None])),
    }
    ext.update(mostly({}, st.sampled_from([{"n": "broker-a"}, {"topic": "T2"}, {"queueId": "1"}])))
    ext = {k: v for k, v in ext.items() if v is not None}
    code = draw(st.sampled_from([RequestCode.SEND_MESSAGE_V2] * 2 + [RequestCode.SEND_MESSAGE]))
    if code == RequestCode.SEND_MESSAGE and draw(st.integers(0, 5)):  # by name, as V1 clients (C++) write them
        ext = {V2_KEYS.get(k, k): v for k, v in ext.items()}
    flag = mostly(0, st.sampled_from([2, 4]))
    body = draw(st.binary(max_size=64))
    if not draw(st.integers(0, 9)):  # the C++ client's way: numbers as JSON numbers
        header = {"code": int(code), "language": "CPP", "version": 0, "opaque": 7, "flag": flag,
                  "extFields": {k: int(v) if v.isascii() and v.isdigit() and len(v) < 10 else
                                {"true": True, "false": False}.get(v, v) for k, v in ext.items()},
                  "serializeTypeCurrentRPC": "JSON"}
        return _frame(json.dumps(header, separators=(",", ":")).encode(), body)
    stype = mostly(SerializeType.JSON, st.just(SerializeType.ROCKETMQ))
    return encode(RemotingCommand(int(code), opaque=draw(st.integers(0, 2**31 - 1)), flag=flag, ext_fields=ext,
                                  body=body, serialize_type=stype))


def _frame(header: bytes, body: bytes) -> bytes:
    return (4 + len(header) + len(body)).to_bytes(4, "big") + len(header).to_bytes(4, "big") + header + body


def compare(fast: Side, generic: Side, loop: asyncio.AbstractEventLoop, frame: bytes, seed: int) -> bool:
    """Whether the fast path took the frame."""
    taken = len(fast.taken)
    got = loop.run_until_complete(fast.feed(frame, seed))
    want = loop.run_until_complete(generic.feed(frame, seed))
    assert got == want
    assert fast.state() == generic.state()
    return len(fast.taken) > taken and fast.taken[-1]


def test_fast_path_answers_and_stores_what_the_generic_path_does(tmp_path: Path) -> None:
    def check(fast: Side, generic: Side, loop: asyncio.AbstractEventLoop) -> None:
        seeds = iter(range(10**9))

        @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
        @given(frames())
        def one(frame: bytes) -> None:
            event("fast path" if compare(fast, generic, loop, frame, next(seeds)) else "generic path")

        one()
        assert any(fast.taken) and not all(fast.taken)

    run_pair(tmp_path, check)


def sdk_frames(count: int) -> list[bytes]:
    producer = Producer("pg", namesrv="127.0.0.1:1")  # never started: only its encoder is used
    out = []
    for i in range(count):
        msg = Message("T", b"body-%d" % i, tags=["TagA", None, "ü"][i % 3], keys=["k1", "k2 k3"][i % 2])
        queue = MessageQueue("T", "b", [0, 3, 2][i % 3])
        out.append(b"".join(encode_parts(producer._request(queue, msg)[0])))
    return out


def test_sdk_sends_take_the_fast_path(tmp_path: Path) -> None:
    def check(fast: Side, generic: Side, loop: asyncio.AbstractEventLoop) -> None:
        for i, frame in enumerate(sdk_frames(30)):
            compare(fast, generic, loop, frame, i)
        assert fast.taken == [True] * 30
        assert fast.broker.store.max_offset("T", 3) == 10

    run_pair(tmp_path, check)


def cpp_frames(count: int) -> list[bytes]:
    """SEND_MESSAGE frames as the C++ client (PyPI rocketmq 0.4.4) writes them (docs/interop-notes.md)."""
    out = []
    for i in range(count):
        ext = {"batch": "0", "bornTimestamp": str(1764000000000 + i), "defaultTopic": "TBW102",
               "defaultTopicQueueNums": 4, "flag": 0, "producerGroup": "pg", "queueId": [0, 3, 2][i % 3],
               "properties": f"KEYS\x01k{i}\x02TAGS\x01TagA\x02UNIQ_KEY\x01{i:032X}\x02WAIT\x01true\x02",
               "reconsumeTimes": "0", "sysFlag": 0, "topic": "T", "unitMode": "0"}
        header = {"code": 10, "language": "CPP", "version": 0, "opaque": 100 + i, "flag": 0, "remark": "",
                  "extFields": ext}
        out.append(_frame(json.dumps(header).encode(), b"cpp-body-%d" % i))
    return out


def test_cpp_client_sends_take_the_fast_path(tmp_path: Path) -> None:
    def check(fast: Side, generic: Side, loop: asyncio.AbstractEventLoop) -> None:
        heard: list[tuple[int, int, bool]] = []
        fast.conn.observer = fast.conn._observer = lambda req, resp, ns, held: heard.append((req, resp, held))
        for i, frame in enumerate(cpp_frames(12)):
            compare(fast, generic, loop, frame, i)
        assert fast.taken == [True] * 12
        assert fast.broker.store.max_offset("T", 3) == 4
        assert heard == [(RequestCode.SEND_MESSAGE, 0, False)] * 12  # counted under the request's own code

    run_pair(tmp_path, check)


def test_sync_flush_answers_from_a_task(tmp_path: Path) -> None:
    def check(fast: Side, generic: Side, loop: asyncio.AbstractEventLoop) -> None:
        for i, frame in enumerate(sdk_frames(12)):
            compare(fast, generic, loop, frame, i)
        assert fast.taken == [True] * 12

    run_pair(tmp_path, check, store_flush_disk_type=FlushDiskType.SYNC_FLUSH)


def test_a_refused_write_is_answered_with_its_reason(tmp_path: Path) -> None:
    def check(fast: Side, generic: Side, loop: asyncio.AbstractEventLoop) -> None:
        for side in (fast, generic):
            side.broker.store.running = False  # the store refuses: SERVICE_NOT_AVAILABLE
        try:
            for i, frame in enumerate(sdk_frames(3)):
                compare(fast, generic, loop, frame, i)
        finally:
            for side in (fast, generic):
                side.broker.store.running = True
        assert fast.taken == [True] * 3
        assert b"the store is not running" in fast.sink.written[-1]

    run_pair(tmp_path, check)


def test_metrics_observer_hears_of_fast_sends(tmp_path: Path) -> None:
    def check(fast: Side, generic: Side, loop: asyncio.AbstractEventLoop) -> None:
        heard: list[tuple[int, int, bool]] = []
        fast.conn.observer = fast.conn._observer = lambda req, resp, ns, held: heard.append((req, resp, held))
        compare(fast, generic, loop, sdk_frames(1)[0], 0)
        assert fast.taken == [True] and heard == [(RequestCode.SEND_MESSAGE_V2, 0, False)]

    run_pair(tmp_path, check)


def test_a_replaced_send_handler_gets_every_send(tmp_path: Path) -> None:
    """The server's handler table is read on every request: a handler put in place of the send handler (a test's
    counting wrapper, say) sees the sends the fast path would otherwise serve."""
    def check(fast: Side, generic: Side, loop: asyncio.AbstractEventLoop) -> None:
        table = fast.broker.dispatcher
        seen: list[int] = []
        inner = table[RequestCode.SEND_MESSAGE_V2]

        async def wrapper(conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand | None:
            seen.append(cmd.opaque)
            return await inner(conn, cmd)

        table[RequestCode.SEND_MESSAGE_V2] = wrapper
        compare(fast, generic, loop, sdk_frames(1)[0], 0)
        assert fast.taken == [False] and len(seen) == 1
        table[RequestCode.SEND_MESSAGE_V2] = inner
        compare(fast, generic, loop, sdk_frames(1)[0], 1)
        assert fast.taken == [False, True] and len(seen) == 1

    run_pair(tmp_path, check)


@st.composite
def chunked(draw: st.DrawFn, sdk: list[bytes]) -> list[bytes]:
    """Several frames, sent back to back, cut into chunks anywhere (as TCP may deliver them)."""
    stream = b"".join(draw(st.lists(st.one_of(st.sampled_from(sdk), frames()), min_size=2, max_size=8)))
    cuts = sorted(draw(st.lists(st.integers(1, len(stream) - 1), max_size=3, unique=True)))
    return [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]


def test_chunks_of_several_frames_are_stored_and_answered_as_the_generic_path_does(tmp_path: Path) -> None:
    """A chunk holding several frames (64 producers on one connection): the fast path serves its whole frames from
    the start while it takes them and leaves the rest, in order, to the generic path. Same records in the same
    order, the same replies (in any order: each names its request's opaque)."""
    def check(fast: Side, generic: Side, loop: asyncio.AbstractEventLoop) -> None:
        seeds = iter(range(10**9))

        @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
        @given(chunked(sdk_frames(6)))
        def one(chunks: list[bytes]) -> None:
            seed = next(seeds)
            got = loop.run_until_complete(fast.feed_chunks(chunks, seed))
            want = loop.run_until_complete(generic.feed_chunks(chunks, seed))
            assert sorted(got) == sorted(want)
            assert fast.state() == generic.state()
            event("several frames taken" if any(t > len(f) // 2 for t, f in zip(fast.took[-len(chunks):], chunks,
                                                                                  strict=True)) else "other")

        one()
        assert any(not t and k for t, k in zip(fast.taken, fast.took, strict=True))  # took part of a chunk

    run_pair(tmp_path, check)
