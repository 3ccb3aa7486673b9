"""A POP (or NOTIFICATION) long poll whose client went away: it must neither take messages for nobody nor stay
parked until its pollTime ends."""

from __future__ import annotations

import asyncio

from cometmq.net.client import RemotingClient
from cometmq.protocol.codes import RequestCode
from cometmq.protocol.remoting import make_request
from tests.pop.conftest import PopCluster
from tests.pop.test_pop import GROUP, TOPIC, consumer, send


async def test_a_long_poll_of_a_closed_connection_takes_no_message(pop_cluster: PopCluster) -> None:
    await pop_cluster.create_topic(TOPIC, 1)
    addr = pop_cluster.broker.addr
    async with consumer(pop_cluster, invisible_duration=30) as sc:
        assert await sc.receive(1, wait=0) == []  # the group exists, the queue's state too
        gone = RemotingClient()
        pop = {"consumerGroup": GROUP, "topic": TOPIC, "queueId": "-1", "maxMsgNums": "32",
               "invisibleTime": "600000", "pollTime": "60000", "bornTime": "0", "initMode": "0"}
        polls = [asyncio.create_task(gone.invoke(addr, make_request(RequestCode.POP_MESSAGE, pop), timeout=70))
                 for _ in range(3)]
        note = {"consumerGroup": GROUP, "topic": TOPIC, "queueId": "-1", "pollTime": "60000", "bornTime": "0"}
        polls.append(asyncio.create_task(gone.invoke(addr, make_request(RequestCode.NOTIFICATION, note),
                                                     timeout=70)))
        svc = pop_cluster.broker.pop.service
        for _ in range(100):
            if svc.waiting() == 4:
                break
            await asyncio.sleep(0.02)
        assert svc.waiting() == 4
        await gone.close()  # the client goes away while its polls are parked
        for t in polls:
            t.cancel()
        await asyncio.gather(*polls, return_exceptions=True)
        await asyncio.sleep(0.3)
        assert svc.waiting() == 0, "the polls of a closed connection stay parked until their pollTime ends"
        await send(pop_cluster, 3)
        await asyncio.sleep(0.3)
        got = await sc.receive(32, wait=2)
        assert len(got) == 3, "the messages went to the closed connection's poll: invisible for its 600 s"
        await sc.ack_many(got)
