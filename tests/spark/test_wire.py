"""A task's pulls over its plain socket (reader._Wire), against a scripted broker in a thread: answers out of
order, a connection that drops (the pulls on it are made again), a broker that never comes back."""

from __future__ import annotations

import json
import socket
import struct
import threading
from collections.abc import Callable, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cometmq.client.errors import ClientConnectionError
from cometmq.client.message import MessageQueue
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.errors import ProtocolError
from cometmq.protocol.message import encode_parts
from cometmq.protocol.remoting import RemotingCommand, decode, encode, make_response
from cometmq.spark import reader
from cometmq.spark.options import ReadOptions
from cometmq.spark.reader import QueueSlice, read_slice
from cometmq.spark.schema import arrow_schema, read_schema

QUEUE_END = 2500
PER_ANSWER = 300  # the scripted broker's cap, like maxTransferBytes


def records(first: int, n: int) -> bytes:
    return b"".join(encode_parts(topic=b"T", body=f"m{i}".encode(), queue_id=0, queue_offset=i,
                                 properties=f"UNIQ_KEY\x01u{i}\x02".encode()) for i in range(first, first + n))


def read_frame(conn: socket.socket) -> RemotingCommand | None:
    head = b""
    while len(head) < 4:
        got = conn.recv(4 - len(head))
        if not got:
            return None
        head += got
    (length,) = struct.unpack(">I", head)
    rest = b""
    while len(rest) < length:
        got = conn.recv(length - len(rest))
        if not got:
            return None
        rest += got
    return decode(head + rest)


def answer(cmd: RemotingCommand) -> bytes:
    offset, count = int(cmd.ext_fields["queueOffset"]), int(cmd.ext_fields["maxMsgNums"])
    n = max(0, min(count, PER_ANSWER, QUEUE_END - offset))
    ext = {"nextBeginOffset": offset + n, "minOffset": 0, "maxOffset": QUEUE_END, "suggestWhichBrokerId": 0}
    if n == 0:
        return encode(make_response(cmd, ResponseCode.PULL_NOT_FOUND, "no", ext))
    return encode(make_response(cmd, ResponseCode.SUCCESS, None, ext, records(offset, n)))


Script = Callable[[int, socket.socket], None]


@pytest.fixture
def broker() -> Iterator[Callable[[Script], str]]:
    """Starts a listener whose connection ``k`` (0, 1, ...) is handled by ``script(k, conn)``."""
    servers: list[socket.socket] = []

    def start(script: Script) -> str:
        srv = socket.create_server(("127.0.0.1", 0))
        servers.append(srv)

        def serve() -> None:
            k = 0
            while True:
                try:
                    conn, _ = srv.accept()
                except OSError:
                    return
                threading.Thread(target=script, args=(k, conn), daemon=True).start()
                k += 1

        threading.Thread(target=serve, daemon=True).start()
        return f"127.0.0.1:{srv.getsockname()[1]}"

    yield start
    for srv in servers:
        srv.close()


def part(addr: str) -> QueueSlice:
    opts = ReadOptions(namesrv="127.0.0.1:9", timeout=5.0)  # no nameserver there: route refreshes fail fast
    return QueueSlice(MessageQueue("T", "broker-a", 0), 0, QUEUE_END, addr, opts)


def offsets(addr: str) -> list[int]:
    out: list[int] = []
    for batch in read_slice(part(addr), arrow_schema(read_schema())):
        out.extend(batch.column("queueOffset").to_pylist())
    return out


def test_answers_out_of_order_are_matched_by_opaque(broker: Callable[[Script], str]) -> None:
    connections = []

    def script(k: int, conn: socket.socket) -> None:
        connections.append(k)
        with conn:
            held: list[RemotingCommand] = []
            while True:
                conn.settimeout(None if not held else 0.05)
                try:
                    cmd = read_frame(conn)
                except TimeoutError:  # no second pull came: answer the one held
                    cmd = None
                    if not held:
                        continue
                else:
                    if cmd is None:
                        return
                    held.append(cmd)
                if len(held) == 2 or cmd is None:
                    for c in reversed(held):  # the later pull answered first
                        conn.sendall(answer(c))
                    held.clear()

    assert offsets(broker(script)) == list(range(QUEUE_END))
    assert connections == [0]  # no timeout, no reconnection


def test_a_dropped_connection_is_made_again(broker: Callable[[Script], str]) -> None:
    def script(k: int, conn: socket.socket) -> None:
        with conn:
            served = 0
            while (cmd := read_frame(conn)) is not None:
                if k < 2 and served == 3:  # the first two connections break after three answers
                    return
                conn.sendall(answer(cmd))
                served += 1

    assert offsets(broker(script)) == list(range(QUEUE_END))


def test_a_broker_that_stays_away_fails_the_task(broker: Callable[[Script], str]) -> None:
    def script(k: int, conn: socket.socket) -> None:
        conn.close()

    with pytest.raises(ClientConnectionError, match="pull of T"):
        offsets(broker(script))


def test_many_small_batches_keep_every_value(broker: Callable[[Script], str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # One batch per answer: the values of every batch yielded stay right while later answers are received.
    monkeypatch.setattr(reader, "BATCH_BYTES", 1)

    def script(k: int, conn: socket.socket) -> None:
        with conn:
            while (cmd := read_frame(conn)) is not None:
                conn.sendall(answer(cmd))

    batches = list(read_slice(part(broker(script)), arrow_schema(read_schema())))
    assert len(batches) > 3
    rows = [row for b in batches for row in zip(b.column("queueOffset").to_pylist(), b.column("body").to_pylist(),
                                                 b.column("msgId").to_pylist(), strict=True)]
    assert rows == [(i, f"m{i}".encode(), f"u{i}") for i in range(QUEUE_END)]



def test_pulls_stay_near_full_answers_when_the_broker_caps_by_bytes(broker: Callable[[Script], str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # Records of nearly one size (as a producer's are: keys k1, k2, ... k1000) and a broker that cuts each answer
    # at a byte budget, as maxTransferBytes does: after the first cut answers the pull size is what fits, less a
    # little, so the read takes about as many pulls as full answers would, plus the rests of the first ones. (The
    # first pulls ask for 64 here, so that the queue is many of them long, as a real one is many 1024s long.)
    monkeypatch.setattr(reader, "PULL_BATCH", 64)
    budget = 30 * 200
    sized = [encode_parts(topic=b"T", body=b"x" * (100 + i % 7), queue_id=0, queue_offset=i,
                          properties=f"UNIQ_KEY\x01u{i}\x02".encode()) for i in range(QUEUE_END)]
    pulls = []

    def script(k: int, conn: socket.socket) -> None:
        with conn:
            while (cmd := read_frame(conn)) is not None:
                offset, count = int(cmd.ext_fields["queueOffset"]), int(cmd.ext_fields["maxMsgNums"])
                pulls.append(count)
                end, size = offset, 0
                while end < min(offset + count, QUEUE_END) and (end == offset or size + len(sized[end]) <= budget):
                    size += len(sized[end])
                    end += 1
                ext = {"nextBeginOffset": end, "minOffset": 0, "maxOffset": QUEUE_END}
                conn.sendall(encode(make_response(cmd, ResponseCode.SUCCESS, None, ext, b"".join(sized[offset:end]))))

    assert offsets(broker(script)) == list(range(QUEUE_END))
    needed = sum(map(len, sized)) / budget  # answers if every one were full
    assert len(pulls) <= 1.2 * needed + 3 * reader.PULL_DEPTH, (len(pulls), needed, pulls)


# -- the frames a task writes and the answer headers it reads ----------------------------------------------------
names = st.text(st.sampled_from("aZ09_%-|\"\\\u00e9\u4e2d\n"), max_size=12)
stand_ins = st.sampled_from([str(n) for n in reader._PullFrames._STAND_INS])


@settings(max_examples=200, deadline=None)
@given(topic=st.one_of(names, stand_ins), group=names, expression=st.one_of(names, stand_ins),
       offset=st.integers(0, 2**63 - 1), count=st.integers(1, 2**31 - 1))
def test_pull_frames_are_what_the_codec_writes(topic: str, group: str, expression: str, offset: int,
                                               count: int) -> None:
    fields = {"consumerGroup": group, "topic": topic, "queueId": "3", "sysFlag": "4", "commitOffset": "0",
              "suspendTimeoutMillis": "0", "subscription": expression, "subVersion": "0", "expressionType": "TAG"}
    frames = reader._PullFrames(fields)
    opaque, frame = frames.frame(offset, count)
    cmd = decode(frame)
    assert cmd.opaque == opaque and cmd.code == RequestCode.PULL_MESSAGE and not cmd.body
    assert cmd.ext_fields == {**fields, "queueOffset": str(offset), "maxMsgNums": str(count)}
    # the template is used whenever the stand-ins are each found once (not when a name contains one)
    assert (frames.template is None) == any(s in topic + expression for s in map(str, frames._STAND_INS))


headers = st.fixed_dictionaries({"code": st.integers(-(2**31), 2**31 - 1), "opaque": st.integers(0, 2**31 - 1)},
                                optional={"flag": st.integers(0, 3), "remark": st.one_of(st.none(), st.text()),
                                          "extFields": st.dictionaries(st.text(max_size=5), st.text(max_size=5)),
                                          "language": st.just("JAVA"), "version": st.integers(0, 500)})


@settings(max_examples=200, deadline=None)
@given(headers)
def test_answer_headers_read_as_the_codec_reads_them(header: dict[str, object]) -> None:
    raw = json.dumps(header).encode()
    word = len(raw)  # serialize type 0 (JSON)
    frame = struct.pack(">II", 4 + len(raw), word) + raw
    cmd = decode(frame)
    got = reader._parse_answer(word, bytearray(raw))
    assert (got.code, got.opaque, got.flag, got.remark, got.ext_fields) == (
        cmd.code, cmd.opaque, cmd.flag, cmd.remark, cmd.ext_fields)


@pytest.mark.parametrize("raw", [b"[1, 2]", b'{"code": "1", "opaque": 2}', b'{"code": 1, "opaque": 2.5}', b"{",
                                 b'{"code": 1, "opaque": 2, "extFields": [1]}'])
def test_answer_headers_the_codec_refuses_are_refused(raw: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode(struct.pack(">II", 4 + len(raw), len(raw)) + raw)
    with pytest.raises(ProtocolError):
        reader._parse_answer(len(raw), bytearray(raw))
