"""The sampler's memory against a cluster whose topics come and go: what it keeps of a topic ends with the topic."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

pytest.importorskip("aiohttp")  # the dashboard extra

from cometmq.client import Admin, Message, Producer
from cometmq.dashboard.data import ClusterData
from cometmq.dashboard.sampler import Sampler
from tests.dashboard.conftest import in_process_cluster

pytestmark = pytest.mark.timeout(60)


async def test_a_topic_sampled_once_is_forgotten_after_the_window(tmp_path: Path) -> None:
    """A rate needs two samples, so the sampler keeps each counter's last value. A topic deleted before its second
    sample got no series, and its last value was kept for good (only a series' expiry dropped it): a dashboard
    watching a cluster that creates and deletes topics grew without bound. It is now dropped after the window."""
    async with in_process_cluster(tmp_path) as namesrv, Admin(namesrv=namesrv) as admin, \
            Producer("SamplerProducer", namesrv=namesrv) as producer:
        data = ClusterData(admin, cache_ttl=0.0)
        sampler = Sampler(data, interval=0.5, window=1.0)
        for i in range(5):
            topic = f"ChurnSampled{i}"
            await admin.create_topic(topic, read_queues=1)
            await producer.send(Message(topic, b"x"))
            await sampler.sample()
            assert any(topic in name for name in sampler._last)
            await admin.delete_topic(topic)
        await asyncio.sleep(1.2)
        await sampler.sample()
        assert not [name for name in sampler._last if "ChurnSampled" in name]
        await data.close()


# the app keys its request storage with strings (aiohttp >= 3.9; newer ones warn about it)
@pytest.mark.filterwarnings("ignore:It is recommended to use web.RequestKey")
async def test_pages_of_topics_and_groups_that_do_not_exist_are_not_watched(tmp_path: Path) -> None:
    """Opening a topic's or group's page has the sampler watch it for a window. Any name in the address was
    watched, so requests for made-up names grew the watch list at the rate they came. Only names that exist are
    watched now."""
    import aiohttp

    from cometmq.dashboard.app import DashboardServer

    async with in_process_cluster(tmp_path) as namesrv:
        board = DashboardServer(namesrv, "127.0.0.1", 0, read_only=True)
        await board.start()
        try:
            async with Admin(namesrv=namesrv) as admin:
                await admin.create_topic("WatchedTopic", read_queues=1)
            async with aiohttp.ClientSession() as http:
                for i in range(30):
                    for kind in ("topics", "groups"):
                        async with http.get(f"{board.url}{kind}/MadeUp{i}") as r:
                            assert r.status == 200
                async with http.get(f"{board.url}topics/WatchedTopic") as r:
                    assert r.status == 200
            assert list(board.sampler.watched) == ["topic:WatchedTopic"]
        finally:
            await board.stop()
