"""MQv2-HMAC-SHA1 verification: the pure verifier, and the endpoint answering UNAUTHORIZED."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from cometmq.grpc.auth import Authenticator, AuthError, authorization_header, date_time_now, parse_access_keys, sign
from cometmq.grpc.v2 import definition_pb2 as pb
from cometmq.grpc.v2 import service_pb2 as spb
from tests.grpc.kit import Endpoint, start_endpoint, stop_endpoint

KEYS = {"ak1": "secret-one", "ak2": "secret-two"}


def md(ak: str, sk: str, when: datetime | None = None) -> dict[str, str]:
    dt = date_time_now(when)
    return {"x-mq-date-time": dt, "authorization": authorization_header(ak, sk, dt)}


def test_known_signature_value() -> None:
    # HMAC-SHA1("key", "The quick brown fox jumps over the lazy dog"), a published test vector
    assert sign("key", "The quick brown fox jumps over the lazy dog") == "de7c9b85b8b78aa6bc8a7a36f70a90701c9db4d9"


def test_valid_credentials_pass() -> None:
    auth = Authenticator(KEYS)
    assert auth.verify(md("ak1", "secret-one")) == "ak1"
    assert auth.verify(md("ak2", "secret-two")) == "ak2"


@pytest.mark.parametrize(("metadata", "why"), [
    ({}, "no authorization"),
    (md("ak1", "wrong"), "signature mismatch"),
    (md("nobody", "secret-one"), "unknown access key"),
    (md("ak1", "secret-one", datetime.now(UTC) - timedelta(hours=1)), "away from the server's clock"),
    ({"x-mq-date-time": "yesterday", "authorization": authorization_header("ak1", "secret-one", "yesterday")},
     "is not yyyyMMddTHHmmssZ"),
    ({"x-mq-date-time": date_time_now(), "authorization": "Basic abc"}, "unsupported authorization algorithm"),
    ({"x-mq-date-time": date_time_now(), "authorization": "MQv2-HMAC-SHA1 Signature=00"}, "names no access key"),
])
def test_bad_credentials_are_refused(metadata: dict[str, str], why: str) -> None:
    with pytest.raises(AuthError, match=why):
        Authenticator(KEYS).verify(metadata)


def test_skew_limit_is_configurable() -> None:
    old = datetime.now(UTC) - timedelta(seconds=100)
    assert Authenticator(KEYS, max_skew_s=200).verify(md("ak1", "secret-one", old)) == "ak1"
    with pytest.raises(AuthError):
        Authenticator(KEYS, max_skew_s=10).verify(md("ak1", "secret-one", old))


def test_parse_access_keys() -> None:
    assert parse_access_keys("a:b, c:d;e:f") == {"a": "b", "c": "d", "e": "f"}
    with pytest.raises(ValueError, match="accessKey:secretKey"):
        parse_access_keys("a:b,broken")


@pytest.fixture
async def secured(tmp_path: Path) -> AsyncIterator[Endpoint]:
    ep = await start_endpoint(tmp_path, auth_enabled=True, access_keys=KEYS)
    yield ep
    await stop_endpoint(ep)


async def test_endpoint_refuses_missing_and_wrong_credentials(secured: Endpoint) -> None:
    await secured.create_topic("Sec")
    route = spb.QueryRouteRequest(topic=pb.Resource(name="Sec"))
    r = await secured.call("QueryRoute", route)
    assert r.status.code == pb.Code.UNAUTHORIZED and not r.message_queues
    secured.credentials = ("ak1", "not-the-secret")
    assert (await secured.call("QueryRoute", route)).status.code == pb.Code.UNAUTHORIZED
    assert (await secured.send("Sec", b"x")).status.code == pb.Code.UNAUTHORIZED
    code, _ = await secured.receive("Sec", "G")
    assert code == pb.Code.UNAUTHORIZED
    call = secured.stub.Telemetry(metadata=secured.metadata(), timeout=5)
    await call.write(spb.TelemetryCommand(settings=pb.Settings(client_type=pb.PRODUCER)))
    reply = await call.read()
    assert reply.status.code == pb.Code.UNAUTHORIZED
    call.cancel()
    secured.credentials = ("ak1", "secret-one")
    r = await secured.call("QueryRoute", route)
    assert r.status.code == pb.Code.OK and r.message_queues
    assert (await secured.send("Sec", b"x")).status.code == pb.Code.OK
