"""KV configs (ORDER_TOPIC_CONFIG & co.) outlive a nameserver restart when it has a kvConfigPath."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cometmq.namesrv.kv_config import ORDER_TOPIC_CONFIG, KVConfigError, KVConfigManager
from cometmq.namesrv.server import NamesrvConfig, NamesrvController
from cometmq.net.client import RemotingClient
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.remoting import RemotingCommand, make_request


async def test_kv_configs_survive_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "namesrv" / "kvConfig.json"
    client = RemotingClient()
    ns = NamesrvController(NamesrvConfig(port=0, kv_config_path=path))
    await ns.start()
    try:
        addr = f"127.0.0.1:{ns.port}"
        put = make_request(RequestCode.PUT_KV_CONFIG, {"namespace": ORDER_TOPIC_CONFIG, "key": "OT",
                                                       "value": "broker-a:4"})
        assert (await client.invoke(addr, put)).code == ResponseCode.SUCCESS
    finally:
        await ns.stop()
    # RocketMQ's file shape
    assert json.loads(path.read_text()) == {"configTable": {ORDER_TOPIC_CONFIG: {"OT": "broker-a:4"}}}
    ns = NamesrvController(NamesrvConfig(port=0, kv_config_path=path))
    await ns.start()
    try:
        addr = f"127.0.0.1:{ns.port}"
        got = await client.invoke(addr, make_request(RequestCode.GET_KV_CONFIG,
                                                     {"namespace": ORDER_TOPIC_CONFIG, "key": "OT"}))
        assert got.code == ResponseCode.SUCCESS and got.ext_fields["value"] == "broker-a:4"
        gone = make_request(RequestCode.DELETE_KV_CONFIG, {"namespace": ORDER_TOPIC_CONFIG, "key": "OT"})
        assert (await client.invoke(addr, gone)).code == ResponseCode.SUCCESS
    finally:
        await ns.stop()
        await client.close()
    assert json.loads(path.read_text()) == {"configTable": {}}


async def test_a_change_the_file_cannot_take_changes_nothing(tmp_path: Path) -> None:
    """PUT/DELETE_KV_CONFIG whose file write fails (disk full, the file unwritable) are answered with an error
    and leave the configs as they were: they were changed in memory first, so the failed value went out in
    routes (an order conf) and vanished at the next restart."""
    path = tmp_path / "kvConfig.json"
    client = RemotingClient()
    ns = NamesrvController(NamesrvConfig(port=0, kv_config_path=path))
    await ns.start()
    try:
        addr = f"127.0.0.1:{ns.port}"

        def put(key: str, value: str) -> RemotingCommand:
            return make_request(RequestCode.PUT_KV_CONFIG, {"namespace": ORDER_TOPIC_CONFIG, "key": key,
                                                            "value": value})

        def get(key: str) -> RemotingCommand:
            return make_request(RequestCode.GET_KV_CONFIG, {"namespace": ORDER_TOPIC_CONFIG, "key": key})

        assert (await client.invoke(addr, put("OT", "broker-a:4"))).code == ResponseCode.SUCCESS
        path.unlink()
        path.mkdir()  # the file can no longer be replaced
        (path / "x").touch()
        for request in (put("OT", "broker-b:8"), put("New", "broker-a:1"),
                        make_request(RequestCode.DELETE_KV_CONFIG, {"namespace": ORDER_TOPIC_CONFIG, "key": "OT"})):
            reply = await client.invoke(addr, request)
            assert reply.code == ResponseCode.SYSTEM_ERROR
            assert reply.remark and "KV config file cannot be written" in reply.remark
        got = await client.invoke(addr, get("OT"))
        assert got.code == ResponseCode.SUCCESS and got.ext_fields["value"] == "broker-a:4"
        assert (await client.invoke(addr, get("New"))).code == ResponseCode.QUERY_NOT_FOUND
    finally:
        await ns.stop()
        await client.close()


@pytest.mark.parametrize("text", ["{", '{"configTable": [1]}', '{"configTable": {"NS": {"k": 1}}}', "[]"])
def test_a_damaged_file_is_refused_with_its_name(tmp_path: Path, text: str) -> None:
    path = tmp_path / "kvConfig.json"
    path.write_text(text)
    with pytest.raises(KVConfigError, match=r"kvConfig\.json: not a KV config file"):
        KVConfigManager(path)
    assert path.read_text() == text  # nothing rewritten


def test_no_path_keeps_them_in_memory() -> None:
    kv = KVConfigManager()
    kv.put("NS", "k", "v")
    assert kv.get("NS", "k") == "v" and kv.namespace("NS") == {"k": "v"}
