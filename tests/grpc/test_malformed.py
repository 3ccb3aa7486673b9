"""Malformed requests on the gRPC endpoint (issue [15]): bytes that do not parse as the method's protobuf are
answered INVALID_ARGUMENT with a short message, before authentication, and logged at most once a minute per peer
at WARNING with no traceback (they were UNKNOWN with a traceback at ERROR per call: a log flood for anyone)."""

from __future__ import annotations

import logging
from pathlib import Path

import grpc
import pytest

from cometmq.grpc.v2 import service_pb2 as spb
from cometmq.net.limits import limited_log
from tests.grpc.kit import start_endpoint, stop_endpoint

pytestmark = pytest.mark.timeout(60)

GARBAGE = b"\xff\xff\xff\xff\x0f"  # a field key with a varint that never ends


@pytest.mark.parametrize("method", ["SendMessage", "QueryRoute", "Heartbeat", "ReceiveMessage"])
async def test_malformed_protobuf_is_invalid_argument_and_logged_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, method: str) -> None:
    limited_log._last.clear()
    ep = await start_endpoint(tmp_path, auth_enabled=True, access_keys={"ak": "sk"})
    try:
        path = f"/apache.rocketmq.v2.MessagingService/{method}"
        if method == "ReceiveMessage":
            call = ep.channel.unary_stream(path, request_serializer=None, response_deserializer=None)
        else:
            call = ep.channel.unary_unary(path, request_serializer=None, response_deserializer=None)
        caplog.clear()
        with caplog.at_level(logging.DEBUG):
            for _ in range(20):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    result = call(GARBAGE, timeout=10)
                    if method == "ReceiveMessage":
                        [item async for item in result]
                    else:
                        await result
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "protobuf" in (err.value.details() or "")
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        assert warnings[0].levelno == logging.WARNING and warnings[0].exc_info is None
        assert not any(r.exc_info for r in caplog.records)
        # A well-formed request still gets its ordinary answer (here: UNAUTHORIZED, for it carries no signature).
        response = await ep.stub.QueryRoute(spb.QueryRouteRequest(), timeout=10)
        assert response.status.code != 0
    finally:
        await stop_endpoint(ep)
