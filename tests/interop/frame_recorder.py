"""Raw-TCP frame recorder (and optional tiny fake broker) for RocketMQ 4.x remoting clients.

Standalone on purpose: it does not import ``cometmq`` so that captures made with it are an
independent check of our own codec.

Frame layout (see docs/interop-notes.md and the remoting reference §1)::

    length:int32 BE | header word:int32 BE (type byte << 24 | header length) | header | body

Usage::

    python tests/interop/frame_recorder.py --port 0 --out /tmp/cap            # record only
    python tests/interop/frame_recorder.py --port 0 --out /tmp/cap --respond  # answer like a broker

The first stdout line is ``{"event": "listening", "host": ..., "port": ...}``; after that one JSON
line per frame (incoming and, with ``--respond``, outgoing).  With ``--out DIR`` every frame is
also appended to ``DIR/frames.jsonl`` (with the raw frame as hex).

``--respond`` makes the recorder answer as name server *and* broker at its own address:

* 105 GET_ROUTEINFO_BY_TOPIC: a TopicRouteData with one broker (``--broker-name``) whose master
  address is the recorder itself; 4 queues (1 for ``%RETRY%`` topics);
* 34 HEART_BEAT / 35 UNREGISTER_CLIENT: 0, tracking consumer client ids per group;
* 10 SEND_MESSAGE: stored in memory (batch bodies split, zlib-inflated when sysFlag&1 for
  batches), reply 0 with msgId/queueId/queueOffset;
* 11 PULL_MESSAGE: stored messages encoded as v1 records (code 0), else 19 after holding the
  request while SUSPEND is set (at most ``--max-hold`` seconds);
* 14/15 consumer offsets (unknown offset answers 0/"0" like a fresh Java broker), 29-32 offsets,
  36 CONSUMER_SEND_MSG_BACK (re-stored at once into ``%RETRY%<group>``, no delay, no DLQ),
  38 consumer list, 41/42 locks (everything granted);
* anything else: 3 REQUEST_CODE_NOT_SUPPORTED (nothing for oneway requests).

It is a test tool, not a broker: no persistence, no delay levels, no tag filtering.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import struct
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REQUEST_NAMES = {
    10: "SEND_MESSAGE",
    11: "PULL_MESSAGE",
    14: "QUERY_CONSUMER_OFFSET",
    15: "UPDATE_CONSUMER_OFFSET",
    29: "SEARCH_OFFSET_BY_TIMESTAMP",
    30: "GET_MAX_OFFSET",
    31: "GET_MIN_OFFSET",
    32: "GET_EARLIEST_MSG_STORETIME",
    34: "HEART_BEAT",
    35: "UNREGISTER_CLIENT",
    36: "CONSUMER_SEND_MSG_BACK",
    38: "GET_CONSUMER_LIST_BY_GROUP",
    40: "NOTIFY_CONSUMER_IDS_CHANGED",
    41: "LOCK_BATCH_MQ",
    42: "UNLOCK_BATCH_MQ",
    105: "GET_ROUTEINFO_BY_TOPIC",
    307: "GET_CONSUMER_RUNNING_INFO",
    310: "SEND_MESSAGE_V2",
    320: "SEND_BATCH_MESSAGE",
}

MAGIC_V1 = 0xDAA320A7
FLAG_RESPONSE = 1
FLAG_ONEWAY = 2
PULL_SUSPEND = 0x2


# --------------------------------------------------------------------------- frame codec


@dataclass
class Frame:
    header: dict[str, Any]
    body: bytes
    serialize_type: int
    raw: bytes

    @property
    def code(self) -> int:
        return int(self.header.get("code", -1))

    @property
    def opaque(self) -> int:
        return int(self.header.get("opaque", 0))

    @property
    def flag(self) -> int:
        return int(self.header.get("flag", 0))

    @property
    def ext(self) -> dict[str, Any]:
        ext = self.header.get("extFields")
        return ext if isinstance(ext, dict) else {}


def parse_frame(raw: bytes) -> Frame:
    """Parse one complete frame, *including* its 4-byte length prefix."""
    (length,) = struct.unpack_from(">I", raw, 0)
    if length + 4 != len(raw):
        raise ValueError(f"length prefix {length} does not match frame size {len(raw)}")
    (word,) = struct.unpack_from(">I", raw, 4)
    stype, hlen = word >> 24, word & 0xFFFFFF
    hdr_bytes = raw[8 : 8 + hlen]
    if stype != 0:
        raise ValueError(f"serialize type {stype} not supported by the recorder (JSON only)")
    header = json.loads(hdr_bytes.decode("utf-8"))
    return Frame(header=header, body=raw[8 + hlen :], serialize_type=stype, raw=raw)


def encode_frame(header: dict[str, Any], body: bytes = b"") -> bytes:
    hdr = json.dumps(header, separators=(",", ":")).encode("utf-8")
    return struct.pack(">II", 4 + len(hdr) + len(body), len(hdr)) + hdr + body


def response(req: Frame, code: int, ext: dict[str, Any] | None = None, body: bytes = b"",
             remark: str = "") -> bytes:
    header = {
        "code": code,
        "language": "JAVA",
        "version": 395,
        "opaque": req.opaque,
        "flag": FLAG_RESPONSE,
        "remark": remark,
        "extFields": {k: str(v) for k, v in (ext or {}).items()},
        "serializeTypeCurrentRPC": "JSON",
    }
    return encode_frame(header, body)


def decode_properties(s: str) -> dict[str, str]:
    props: dict[str, str] = {}
    for item in s.split("\x02"):
        if not item:
            continue
        k, _, v = item.partition("\x01")
        props[k] = v
    return props


def encode_properties(props: dict[str, str]) -> str:
    return "".join(f"{k}\x01{v}\x02" for k, v in props.items())


def split_batch_body(body: bytes) -> list[tuple[int, bytes, str]]:
    """Split a batch body into (flag, body, properties-string) per message (reference §4)."""
    out: list[tuple[int, bytes, str]] = []
    pos = 0
    while pos < len(body):
        total, _magic, _crc, flag, blen = struct.unpack_from(">iiiii", body, pos)
        p = pos + 20
        mbody = body[p : p + blen]
        p += blen
        (plen,) = struct.unpack_from(">h", body, p)
        p += 2
        props = body[p : p + plen].decode("utf-8")
        out.append((flag, mbody, props))
        pos += total
    return out


def describe(frame: Frame) -> dict[str, Any]:
    """JSON-able summary of a frame: header as-is, ext key types, body as text/JSON if possible."""
    info: dict[str, Any] = {
        "code": frame.code,
        "name": REQUEST_NAMES.get(frame.code, "?") if not frame.flag & FLAG_RESPONSE else "RESPONSE",
        "flag": frame.flag,
        "opaque": frame.opaque,
        "header": frame.header,
        "ext_types": {k: type(v).__name__ for k, v in frame.ext.items()},
        "body_len": len(frame.body),
    }
    if frame.body:
        try:
            text = frame.body.decode("utf-8")
        except UnicodeDecodeError:
            info["body_hex"] = frame.body.hex()
        else:
            try:
                info["body_json"] = json.loads(text)
            except ValueError:
                info["body_text"] = text
    if "properties" in frame.ext and isinstance(frame.ext["properties"], str):
        info["properties"] = decode_properties(frame.ext["properties"])
    return info


# --------------------------------------------------------------------------- fake broker state


@dataclass
class StoredMessage:
    topic: str
    queue_id: int
    queue_offset: int
    phys_offset: int
    flag: int
    sys_flag: int
    body: bytes
    properties: dict[str, str]
    born_ts: int
    store_ts: int
    reconsume_times: int
    born_host: tuple[str, int]


@dataclass
class State:
    host: str
    port: int
    broker_name: str
    queue_nums: int
    max_hold: float
    queues: dict[tuple[str, int], list[StoredMessage]] = field(default_factory=dict)
    by_phys: dict[int, StoredMessage] = field(default_factory=dict)
    next_phys: int = 0
    offsets: dict[tuple[str, str, int], int] = field(default_factory=dict)
    consumers: dict[str, dict[str, int]] = field(default_factory=dict)  # group -> clientID -> conn
    new_message: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    def store(self, topic: str, queue_id: int, flag: int, sys_flag: int, body: bytes,
              props: dict[str, str], born_ts: int, reconsume: int,
              born_host: tuple[str, int]) -> StoredMessage:
        q = self.queues.setdefault((topic, queue_id), [])
        msg = StoredMessage(topic, queue_id, len(q), self.next_phys, flag, sys_flag, body, props,
                            born_ts, int(time.time() * 1000), reconsume, born_host)
        q.append(msg)
        self.by_phys[msg.phys_offset] = msg
        self.next_phys += len(encode_record(msg, self))
        self.new_message.set()
        self.new_message = asyncio.Event()
        return msg


def offset_msg_id(host: str, port: int, phys: int) -> str:
    return (socket.inet_aton(host) + struct.pack(">iq", port, phys)).hex().upper()


def encode_record(m: StoredMessage, st: State) -> bytes:
    topic = m.topic.encode()
    props = encode_properties(m.properties).encode()
    crc = zlib.crc32(m.body) & 0x7FFFFFFF
    total = 91 + len(m.body) + len(topic) + len(props)
    return b"".join([
        struct.pack(">iIiiiqqiq", total, MAGIC_V1, crc, m.queue_id, m.flag, m.queue_offset,
                    m.phys_offset, m.sys_flag, m.born_ts),
        socket.inet_aton(m.born_host[0]), struct.pack(">i", m.born_host[1]),
        struct.pack(">q", m.store_ts),
        socket.inet_aton(st.host), struct.pack(">i", st.port),
        struct.pack(">iq", m.reconsume_times, 0),
        struct.pack(">i", len(m.body)), m.body,
        struct.pack(">b", len(topic)), topic,
        struct.pack(">h", len(props)), props,
    ])


def route_data(st: State, topic: str) -> dict[str, Any]:
    nums = 1 if topic.startswith("%RETRY%") else st.queue_nums
    return {
        "orderTopicConf": "",
        "queueDatas": [{"brokerName": st.broker_name, "readQueueNums": nums, "writeQueueNums": nums,
                        "perm": 6, "topicSysFlag": 0}],
        "brokerDatas": [{"cluster": "DefaultCluster", "brokerName": st.broker_name,
                         "brokerAddrs": {"0": st.addr}}],
        "filterServerTable": {},
    }


def _int(v: Any, default: int = 0) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


async def handle_request(st: State, req: Frame, conn_id: int, peer: tuple[str, int]) -> bytes | None:
    """Build the reply for ``req`` (None = no reply)."""
    code, ext = req.code, req.ext
    oneway = bool(req.flag & FLAG_ONEWAY)
    if code == 105:
        return response(req, 0, body=json.dumps(route_data(st, str(ext.get("topic", "")))).encode())
    if code == 34:
        hb = json.loads(req.body or b"{}")
        for cd in hb.get("consumerDataSet", []) or []:
            st.consumers.setdefault(cd["groupName"], {})[hb.get("clientID", "")] = conn_id
        return response(req, 0)
    if code == 35:
        group = ext.get("consumerGroup") or ""
        if group:
            st.consumers.get(group, {}).pop(str(ext.get("clientID", "")), None)
        return response(req, 0)
    if code == 10:
        topic = str(ext.get("topic"))
        qid = _int(ext.get("queueId"))
        sys_flag = _int(ext.get("sysFlag"))
        born = _int(ext.get("bornTimestamp"), int(time.time() * 1000))
        reconsume = _int(ext.get("reconsumeTimes"))
        is_batch = str(ext.get("batch", "0")).lower() in ("1", "true")
        if is_batch:
            body = zlib.decompress(req.body) if sys_flag & 1 else req.body
            parts = split_batch_body(body)
            stored = [st.store(topic, qid, f, 0, b, decode_properties(p), born, reconsume, peer)
                      for f, b, p in parts]
        else:
            stored = [st.store(topic, qid, _int(ext.get("flag")), sys_flag, req.body,
                               decode_properties(str(ext.get("properties", ""))), born, reconsume,
                               peer)]
        ids = ",".join(offset_msg_id(st.host, st.port, m.phys_offset) for m in stored)
        if oneway:
            return None
        return response(req, 0, {"msgId": ids, "queueId": qid, "queueOffset": stored[0].queue_offset})
    if code == 11:
        topic, qid = str(ext.get("topic")), _int(ext.get("queueId"))
        offset, max_n = _int(ext.get("queueOffset")), _int(ext.get("maxMsgNums"), 32)
        deadline = time.monotonic() + (st.max_hold if _int(ext.get("sysFlag")) & PULL_SUSPEND else 0)
        while True:
            q = st.queues.get((topic, qid), [])
            if offset < len(q):
                msgs = q[offset : offset + max_n]
                body = b"".join(encode_record(m, st) for m in msgs)
                return response(req, 0, {"suggestWhichBrokerId": 0,
                                         "nextBeginOffset": offset + len(msgs),
                                         "minOffset": 0, "maxOffset": len(q)}, body)
            if offset > len(q):
                return response(req, 21, {"suggestWhichBrokerId": 0, "nextBeginOffset": len(q),
                                          "minOffset": 0, "maxOffset": len(q)})
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return response(req, 19, {"suggestWhichBrokerId": 0, "nextBeginOffset": offset,
                                          "minOffset": 0, "maxOffset": len(q)})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(st.new_message.wait(), remaining)
    if code == 14:
        key = (str(ext.get("consumerGroup")), str(ext.get("topic")), _int(ext.get("queueId")))
        return response(req, 0, {"offset": st.offsets.get(key, 0)})
    if code == 15:
        key = (str(ext.get("consumerGroup")), str(ext.get("topic")), _int(ext.get("queueId")))
        st.offsets[key] = _int(ext.get("commitOffset"))
        return None if oneway else response(req, 0)
    if code in (30, 31):
        n = len(st.queues.get((str(ext.get("topic")), _int(ext.get("queueId"))), []))
        return response(req, 0, {"offset": n if code == 30 else 0})
    if code == 29:
        return response(req, 0, {"offset": 0})
    if code == 32:
        return response(req, 0, {"timestamp": 0})
    if code == 38:
        ids = sorted(st.consumers.get(str(ext.get("consumerGroup")), {}))
        return response(req, 0, body=json.dumps({"consumerIdList": ids}).encode())
    if code == 36:
        group = str(ext.get("group"))
        orig = st.by_phys.get(_int(ext.get("offset"), -1))
        if orig is None:
            return response(req, 1, remark="message not found")
        props = dict(orig.properties)
        props.setdefault("RETRY_TOPIC", orig.topic)
        props.setdefault("ORIGIN_MESSAGE_ID", offset_msg_id(st.host, st.port, orig.phys_offset))
        props["RECONSUME_TIME"] = str(orig.reconsume_times + 1)
        st.store(f"%RETRY%{group}", 0, orig.flag, orig.sys_flag, orig.body, props, orig.born_ts,
                 orig.reconsume_times + 1, orig.born_host)
        return response(req, 0)
    if code == 41:
        req_body = json.loads(req.body or b"{}")
        return response(req, 0, body=json.dumps({"lockOKMQSet": req_body.get("mqSet", [])}).encode())
    if code == 42:
        return response(req, 0)
    if oneway:
        return None
    return response(req, 3, remark=f"request code {code} not supported by frame_recorder")


# --------------------------------------------------------------------------- server


class Recorder:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out: Any = None
        self.conn_seq = 0
        self.frame_seq = 0
        self.state: State | None = None

    def emit(self, direction: str, conn_id: int, frame: Frame) -> None:
        self.frame_seq += 1
        rec = {"seq": self.frame_seq, "t": time.time(), "conn": conn_id, "dir": direction,
               **describe(frame)}
        if not self.args.quiet:
            print(json.dumps(rec, default=str), flush=True)
        if self.out is not None:
            rec["raw_hex"] = frame.raw.hex()
            self.out.write(json.dumps(rec, default=str) + "\n")
            self.out.flush()

    async def on_conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.conn_seq += 1
        conn_id = self.conn_seq
        peer = writer.get_extra_info("peername")[:2]
        lock = asyncio.Lock()
        tasks: set[asyncio.Task[None]] = set()

        async def serve(req: Frame) -> None:
            assert self.state is not None
            try:
                reply = await handle_request(self.state, req, conn_id, peer)
            except Exception as exc:  # a test tool: report and answer SYSTEM_ERROR
                print(json.dumps({"event": "handler_error", "code": req.code, "error": repr(exc)}),
                      file=sys.stderr, flush=True)
                reply = None if req.flag & FLAG_ONEWAY else response(req, 1, remark=repr(exc))
            if reply is None:
                return
            self.emit("out", conn_id, parse_frame(reply))
            async with lock:
                writer.write(reply)
                await writer.drain()

        try:
            while True:
                prefix = await reader.readexactly(4)
                (length,) = struct.unpack(">I", prefix)
                raw = prefix + await reader.readexactly(length)
                frame = parse_frame(raw)
                self.emit("in", conn_id, frame)
                if self.args.respond and not frame.flag & FLAG_RESPONSE:
                    t = asyncio.create_task(serve(frame))
                    tasks.add(t)
                    t.add_done_callback(tasks.discard)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            for t in tasks:
                t.cancel()
            if self.state is not None:
                for clients in self.state.consumers.values():
                    for cid in [c for c, conn in clients.items() if conn == conn_id]:
                        del clients[cid]
            writer.close()

    async def run(self) -> None:
        if self.args.out:
            Path(self.args.out).mkdir(parents=True, exist_ok=True)
            self.out = open(Path(self.args.out) / "frames.jsonl", "a", encoding="utf-8")  # noqa: SIM115
        server = await asyncio.start_server(self.on_conn, self.args.host, self.args.port)
        port = server.sockets[0].getsockname()[1]
        self.state = State(self.args.host, port, self.args.broker_name, self.args.queue_nums,
                           self.args.max_hold)
        print(json.dumps({"event": "listening", "host": self.args.host, "port": port}), flush=True)
        async with server:
            if self.args.seconds:
                await asyncio.sleep(self.args.seconds)
            else:
                await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0 = pick a free port (printed on stdout)")
    ap.add_argument("--out", help="directory for frames.jsonl (appended)")
    ap.add_argument("--respond", action="store_true", help="answer requests like namesrv + broker")
    ap.add_argument("--broker-name", default="recorder-broker")
    ap.add_argument("--queue-nums", type=int, default=4)
    ap.add_argument("--max-hold", type=float, default=1.0, help="max seconds to hold a suspended pull")
    ap.add_argument("--seconds", type=float, default=0, help="exit after this long (0 = forever)")
    ap.add_argument("--quiet", action="store_true", help="no per-frame stdout lines")
    args = ap.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(Recorder(args).run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
