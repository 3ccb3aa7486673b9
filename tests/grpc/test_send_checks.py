"""SendMessage's checks of what a client sends: a compressed body is judged by what it expands to without
expanding all of it, and a request is refused as a whole (nothing stored) when any of its messages is bad."""

from __future__ import annotations

import gzip
import tracemalloc
from pathlib import Path

from cometmq.grpc.v2 import definition_pb2 as pb
from cometmq.grpc.v2 import service_pb2 as spb
from tests.grpc.kit import Endpoint, new_message_id, start_endpoint, stop_endpoint


def _message(topic: str, body: bytes, **system: object) -> pb.Message:
    sp = pb.SystemProperties(message_id=new_message_id(), **system)  # type: ignore[arg-type]
    return pb.Message(topic=pb.Resource(name=topic), body=body, system_properties=sp)


async def test_gzip_bomb_is_refused_without_expanding_it(endpoint: Endpoint) -> None:
    """A body sent GZIP-encoded was expanded whole before its size was checked: 256 KiB on the wire made
    256 MiB in the endpoint (a 5 MiB request, the most gRPC lets in, about 5 GiB). Now the expansion stops
    past the limit."""
    await endpoint.create_topic("Bomb", queues=1)
    bomb = gzip.compress(b"\0" * (256 << 20), compresslevel=9)
    assert len(bomb) < 1 << 20
    tracemalloc.start()
    try:
        r = await endpoint.call("SendMessage", spb.SendMessageRequest(messages=[
            _message("Bomb", bomb, body_encoding=pb.GZIP)]), timeout=60)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert r.status.code == pb.Code.MESSAGE_BODY_TOO_LARGE, r.status
    assert "4194304" in r.status.message
    assert peak < 64 << 20, peak  # a few times the 4 MiB limit at most, not the 256 MiB the body expands to
    assert endpoint.broker.store.get_messages("Bomb", 0, 0, 10).buffers == []


async def test_gzip_body_within_the_limit_is_stored_expanded(endpoint: Endpoint) -> None:
    await endpoint.create_topic("Zipped", queues=1)
    body = b"hello " * 1000
    r = await endpoint.call("SendMessage", spb.SendMessageRequest(messages=[
        _message("Zipped", gzip.compress(body), body_encoding=pb.GZIP)]))
    assert r.status.code == pb.Code.OK, r.status
    code, msgs = await endpoint.receive("Zipped", "G")
    assert code == pb.Code.OK and [m.body for m in msgs] == [body]
    r = await endpoint.call("SendMessage", spb.SendMessageRequest(messages=[
        _message("Zipped", b"not gzip at all", body_encoding=pb.GZIP)]))
    assert r.status.code == pb.Code.MESSAGE_CORRUPTED, r.status


async def test_a_request_with_one_bad_message_stores_none(endpoint: Endpoint) -> None:
    """Each message was checked and sent on its own: the good ones of a request with a bad one were stored
    (MULTIPLE_RESULTS), and messages of several topics went each to its own. RocketMQ's proxy checks them all
    first and refuses the whole request: the bad message's code, or MESSAGE_CORRUPTED for mixed topics."""
    await endpoint.create_topic("Whole", queues=1)
    await endpoint.create_topic("Other", queues=1)
    r = await endpoint.call("SendMessage", spb.SendMessageRequest(messages=[
        _message("Whole", b"good"), _message("Whole", b"bad", tag="a|b")]))
    assert r.status.code == pb.Code.ILLEGAL_MESSAGE_TAG, r.status
    r = await endpoint.call("SendMessage", spb.SendMessageRequest(messages=[
        _message("Whole", b"here"), _message("Other", b"there")]))
    assert r.status.code == pb.Code.MESSAGE_CORRUPTED, r.status
    assert "topic" in r.status.message
    for topic in ("Whole", "Other"):
        assert endpoint.broker.store.get_messages(topic, 0, 0, 10).buffers == []
    r = await endpoint.call("SendMessage", spb.SendMessageRequest(messages=[
        _message("Whole", b"one"), _message("Whole", b"two")]))
    assert r.status.code == pb.Code.OK and [e.status.code for e in r.entries] == [pb.Code.OK] * 2


async def test_the_gzip_bodies_of_one_request_inflate_to_one_frame_at_most(tmp_path: Path) -> None:
    """Each GZIP body was bounded by max_body_size, but a request may hold thousands of messages: 96 bytes each
    inflating to the 4 MiB limit, a 5 MiB request made gigabytes in the endpoint before any was sent. Now the
    bodies of a request, inflated, may hold what one request frame holds uncompressed (max_body_size + 1 MiB)."""
    limit = 64 << 10
    ep = await start_endpoint(tmp_path, max_body_size=limit)
    try:
        await ep.create_topic("Bombs", queues=1)
        one = gzip.compress(bytes(limit), compresslevel=9)
        fits = (limit + (1 << 20)) // limit  # this many whole bodies fit in one frame
        r = await ep.call("SendMessage", spb.SendMessageRequest(messages=[
            _message("Bombs", one, body_encoding=pb.GZIP) for _ in range(fits)]))
        assert r.status.code == pb.Code.OK, r.status
        stored = ep.broker.store.commitlog.max_offset
        tracemalloc.start()
        try:
            r = await ep.call("SendMessage", spb.SendMessageRequest(messages=[
                _message("Bombs", one, body_encoding=pb.GZIP) for _ in range(1000)]), timeout=60)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert r.status.code == pb.Code.MESSAGE_BODY_TOO_LARGE, r.status
        assert str(limit + (1 << 20)) in r.status.message, r.status
        assert peak < 8 << 20, peak  # about one frame, not the 64 MiB the bodies inflate to
        assert ep.broker.store.commitlog.max_offset == stored
    finally:
        await stop_endpoint(ep)
