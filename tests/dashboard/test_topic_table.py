"""The Topics page's figures come from the dashboard's topic table (server-side aggregation): once a pass over
every topic has run, a page load costs the cluster the topic list and one topic-config request per master, not a
route and a stats request per row."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aiohttp")  # the dashboard extra

from cometmq.client import Admin, Message, Producer
from cometmq.dashboard.data import ClusterData
from cometmq.protocol.codes import RequestCode
from tests.dashboard.conftest import in_process_cluster

TOPICS = [f"TableTopic{i}" for i in range(60)]


async def test_a_topics_page_load_is_a_handful_of_requests(tmp_path: Path) -> None:
    async with in_process_cluster(tmp_path) as namesrv, Admin(namesrv=namesrv) as admin, \
            Producer("TableProducer", namesrv=namesrv) as producer:
        await asyncio.gather(*(admin.create_topic(t, read_queues=2) for t in TOPICS))
        for i, t in enumerate(TOPICS[:5]):
            for _ in range(i + 1):
                await producer.send(Message(t, b"x"))
        data = ClusterData(admin, cache_ttl=0.0)  # every list asked again: the requests a load costs
        calls: Counter[int] = Counter()
        invoke = admin.instance.invoke

        async def counting(addr: str, cmd: Any, *args: Any, **kwargs: Any) -> Any:
            calls[cmd.code] += 1
            return await invoke(addr, cmd, *args, **kwargs)
        admin.instance.invoke = counting  # type: ignore[method-assign]

        first = await data.topics("TableTopic", size=50)
        held = {r["name"]: r["held"] for r in first["rows"]}
        assert [held[t] for t in TOPICS[:5]] == [1, 2, 3, 4, 5] and held[TOPICS[-11]] == 0
        assert calls[RequestCode.GET_TOPIC_STATS_INFO] >= 50  # no table yet: the rows shown are read
        task = data._table_task
        assert task is not None  # ... and a pass over every topic started
        await task
        assert data.last_pass["requests"] >= len(TOPICS) and data.last_pass["failed"] == 0

        calls.clear()
        second = await data.topics("TableTopic", page=2, size=50)
        assert [r["held"] for r in second["rows"]] == [0] * 10 and second["total"] == len(TOPICS)
        assert calls[RequestCode.GET_TOPIC_STATS_INFO] == 0 and calls[RequestCode.GET_ROUTEINFO_BY_TOPIC] == 0
        # the topic list, the cluster info (asked three times here, the cache being off), the master's configs
        assert calls[RequestCode.GET_ALL_TOPIC_CONFIG] == 1 and sum(calls.values()) <= 6, calls
        assert data._table_task is None  # the table is fresh: no pass

        # a row the table has from too long ago is read again
        data.figures[TOPICS[0]] = (data.figures[TOPICS[0]][0] - 3 * data.table_period(), {"held": -1,
                                                                                         "written": -1,
                                                                                         "queues": 0})
        third = await data.topics(TOPICS[0])
        assert third["rows"][0]["held"] == 1
        await data.close()
