"""Send a few messages and consume them with a push consumer (asyncio).

Run `cometmq serve` first (or scripts/serve), create the topic (a first send would create it with the broker's
defaults too), then run this:

    cometmq admin updateTopic -n 127.0.0.1:9876 -t ExampleTopic -r 4 -w 4
    python examples/produce_and_consume.py

Then look at what happened: `cometmq admin consumerProgress -n 127.0.0.1:9876 -g example-consumer`,
`cometmq admin queryMsgByKey -n 127.0.0.1:9876 -t ExampleTopic -k k0`.
"""

import asyncio

from cometmq.client import ConsumeStatus, Message, MessageExt, Producer, PushConsumer

NAMESRV = "127.0.0.1:9876"


async def main() -> None:
    async with Producer("example-producer", namesrv=NAMESRV) as producer:
        for i in range(5):
            result = await producer.send(Message("ExampleTopic", f"hello {i}".encode(), tags="TagA", keys=f"k{i}"))
            print("sent", result.msg_id, "to queue", result.queue.queue_id, "at offset", result.queue_offset)

    received = asyncio.Event()
    count = 0

    async def on_messages(msgs: list[MessageExt]) -> ConsumeStatus:
        nonlocal count
        for m in msgs:
            print("received", m.msg_id, m.tags, m.body.decode())
        count += len(msgs)
        if count >= 5:
            received.set()
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer("example-consumer", namesrv=NAMESRV, consume_from="first", listener=on_messages)
    consumer.subscribe("ExampleTopic", "TagA || TagB")
    async with consumer:
        await asyncio.wait_for(received.wait(), 30)


if __name__ == "__main__":
    asyncio.run(main())
