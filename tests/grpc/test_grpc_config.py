"""``--grpc-config``: the gRPC endpoint's limits from a RocketMQ 5 proxy's rmq-proxy.json, on ``cometmq serve`` and
``cometmq proxy``; a file that is wrong in any way stops the start, naming the file and the key."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from cometmq.grpc.config import PROXY_JSON_KEYS, ProxyConfig, load_proxy_json
from cometmq.grpc.v2 import definition_pb2 as pb
from cometmq.grpc.v2 import service_pb2 as spb
from cometmq.grpc.v2 import service_pb2_grpc
from tests.grpc.kit import new_message_id
from tests.grpc.test_cli_grpc import Proc, _create_topic, cometmq, procs  # noqa: F401 (procs: a fixture)
from tests.kit.ports import free_port


def test_every_key_names_a_field_of_the_endpoint_config() -> None:
    fields = ProxyConfig.__dataclass_fields__
    assert all(name in fields for name in PROXY_JSON_KEYS.values())


def test_a_file_sets_the_limits_it_names(tmp_path: Path) -> None:
    path = tmp_path / "rmq-proxy.json"
    path.write_text(json.dumps({"rocketMQClusterName": "DefaultCluster", "userPropertyMaxNum": 2,
                                "minInvisibleTimeMillsForRecv": 1000, "enableMessageBodyEmptyCheck": False,
                                "maxDelayTimeMills": 0}))
    assert load_proxy_json(path) == {"max_user_properties": 2, "min_receive_invisible_ms": 1000,
                                     "empty_body_check": False, "max_delay_ms": 0}


@pytest.mark.parametrize("text, names", [
    ('{"userPropertyMaxNum": 2, "userPropertyMaxNum": 3}', "'userPropertyMaxNum' is given twice"),
    ('{"userPropertyMaxnum": 2}', "unknown key 'userPropertyMaxnum'"),
    ('{"userPropertyMaxNum": "2"}', "userPropertyMaxNum must be an integer"),
    ('{"userPropertyMaxNum": 2.5}', "userPropertyMaxNum must be an integer"),
    ('{"userPropertyMaxNum": true}', "userPropertyMaxNum must be an integer"),
    ('{"maxMessageSize": 0}', "maxMessageSize must be an integer from 1"),
    ('{"maxMessageSize": 2147483648}', "maxMessageSize must be an integer from 1"),
    ('{"maxDelayTimeMills": 99999999999999999999}', "maxDelayTimeMills must be an integer"),
    ('{"enableMessageBodyEmptyCheck": 1}', "enableMessageBodyEmptyCheck must be true or false"),
    ("[1, 2]", "not a JSON object"),
    ("{", "not JSON"),
])
def test_a_wrong_file_is_refused_naming_the_key(tmp_path: Path, text: str, names: str) -> None:
    path = tmp_path / "rmq-proxy.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=str(path)) as caught:
        load_proxy_json(path)
    assert names in str(caught.value)


def test_a_file_sets_the_renewal_by_rocketmq_keys(tmp_path: Path) -> None:
    path = tmp_path / "rmq-proxy.json"
    path.write_text(json.dumps({"enableProxyAutoRenew": False, "defaultInvisibleTimeMills": 30_000,
                                "renewAheadTimeMillis": 5000, "renewSchedulePeriodMillis": 1000,
                                "renewMaxTimeMillis": 3_600_000, "maxRenewRetryTimes": 5,
                                "invisibleTimeMillisWhenClear": 2000}))
    fields = load_proxy_json(path)
    assert fields == {"auto_renew": False, "default_invisible_ms": 30_000, "renew_ahead_ms": 5000,
                      "renew_period_ms": 1000, "renew_max_ms": 3_600_000, "max_renew_retries": 5,
                      "clear_invisible_ms": 2000}
    assert ProxyConfig(**fields).renew_period_ms == 1000


@pytest.mark.parametrize("text, names", [
    ('{"renewSchedulePeriodMillis": 0}', "renewSchedulePeriodMillis must be an integer from 1"),
    ('{"defaultInvisibleTimeMills": 43200001}', "defaultInvisibleTimeMills must be an integer from 1 to 43200000"),
    ('{"invisibleTimeMillisWhenClear": -1}', "invisibleTimeMillisWhenClear must be an integer from 0"),
    ('{"enableProxyAutoRenew": "yes"}', "enableProxyAutoRenew must be true or false"),
])
def test_a_wrong_renewal_setting_is_refused_naming_the_key(tmp_path: Path, text: str, names: str) -> None:
    path = tmp_path / "rmq-proxy.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=names):
        load_proxy_json(path)


@pytest.mark.parametrize("changes, names", [
    ({"renew_period_ms": 0}, "renew_period_ms must be an integer from 1"),
    ({"renew_max_per_client": -1}, "renew_max_per_client must be an integer from 0"),
    ({"renew_steps_ms": ()}, "renew_steps_ms must be one or more integers"),
    ({"renew_steps_ms": (1000, 12 * 3600 * 1000 + 1)}, "renew_steps_ms must be one or more integers"),
])
def test_an_embedded_config_with_a_wrong_renewal_setting_is_refused(changes: dict[str, object], names: str) -> None:
    with pytest.raises(ValueError, match=names):
        ProxyConfig(**changes)  # type: ignore[arg-type]


def test_an_unreadable_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "latin1.json").write_bytes(b'{"k\xe9": 1}')
    for path in (tmp_path / "missing.json", tmp_path / "latin1.json"):
        with pytest.raises(ValueError, match="cannot be read"):
            load_proxy_json(path)


def test_serve_with_a_wrong_file_does_not_start(tmp_path: Path) -> None:
    path = tmp_path / "rmq-proxy.json"
    path.write_text('{"minInvisibleTimeMillsForRecv": "1s"}')
    r = subprocess.run(cometmq("serve", "--data", str(tmp_path / "d"), "--namesrv-port", str(free_port()),
                               "--broker-port", str(free_port()), "--grpc-port", str(free_port()),
                               "--grpc-config", str(path)), capture_output=True, text=True, timeout=60)
    message = " ".join(r.stderr.replace("│", " ").split())
    assert r.returncode == 2, message
    assert "--grpc-config" in message and "minInvisibleTimeMillsForRecv must be an integer" in message
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "d").exists()  # refused before anything started


def _message(topic: str, user: dict[str, str]) -> pb.Message:
    return pb.Message(topic=pb.Resource(name=topic), body=b"x", user_properties=user,
                      system_properties=pb.SystemProperties(message_id=new_message_id()))


async def _limits_in_force(port: int, topic: str) -> None:
    """userPropertyMaxNum 1 and minInvisibleTimeMillsForRecv 1000, as the file says (the defaults: 128, 10 s)."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = service_pb2_grpc.MessagingServiceStub(ch)  # type: ignore[no-untyped-call]
        meta = (("x-mq-client-id", f"grpc-config-test-{port}"),)
        r = await stub.SendMessage(spb.SendMessageRequest(messages=[_message(topic, {"a": "1"})]), timeout=10,
                                   metadata=meta)
        assert r.status.code == pb.Code.OK, r.status
        r = await stub.SendMessage(spb.SendMessageRequest(messages=[_message(topic, {"a": "1", "b": "2"})]),
                                   timeout=10, metadata=meta)
        assert r.status.code == pb.Code.MESSAGE_PROPERTIES_TOO_LARGE, r.status
        assert "max_user_properties (1)" in r.status.message
        request = spb.ReceiveMessageRequest(
            group=pb.Resource(name="GrpcConfigGroup"), batch_size=1, auto_renew=False,
            message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=-1, permission=pb.READ_WRITE,
                                          broker=pb.Broker(name="broker-a")),
            filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"),
            invisible_duration=Duration(seconds=1), long_polling_timeout=Duration(seconds=1))
        codes = [m.status.code async for m in stub.ReceiveMessage(request, timeout=10, metadata=meta)
                 if m.WhichOneof("content") == "status"]
        assert codes and pb.Code.ILLEGAL_INVISIBLE_TIME not in codes, codes


def test_serve_and_proxy_take_the_limits_from_the_file(tmp_path: Path, procs: list[Proc]) -> None:  # noqa: F811
    path = tmp_path / "rmq-proxy.json"
    path.write_text('{"userPropertyMaxNum": 1, "minInvisibleTimeMillsForRecv": 1000}')
    ns, bp, gp, pp = free_port(), free_port(), free_port(), free_port()
    procs.append(Proc(cometmq("serve", "--data", str(tmp_path / "data"), "--namesrv-port", str(ns), "--broker-port",
                              str(bp), "--grpc-port", str(gp), "--grpc-config", str(path)), "cometmq serving"))
    procs.append(Proc(cometmq("proxy", "--namesrv", f"127.0.0.1:{ns}", "--grpc-port", str(pp),
                              "--grpc-config", str(path)), "cometmq proxy listening"))
    asyncio.run(_create_topic(f"127.0.0.1:{bp}", f"127.0.0.1:{ns}", "GrpcConfigTopic"))
    for port in (gp, pp):
        asyncio.run(_limits_in_force(port, "GrpcConfigTopic"))
