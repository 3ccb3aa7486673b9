"""Ordered sends by business key, and a SQL92 filter evaluated on the broker.

Start the broker with property filtering on: create broker.conf with `enablePropertyFilter=true`, then
`cometmq serve -c broker.conf`, create the ordered topic, then run this:

    cometmq admin updateTopic -n 127.0.0.1:9876 -t Orders -r 4 -w 4 -o true
    python examples/ordered_and_filtered.py

(A 5.x FIFO consumer of the topic, gRPC or POP, also needs its group marked orderly:
`cometmq admin updateSubGroup -n 127.0.0.1:9876 -g paid-orders -o true`.)
"""

import asyncio

from cometmq.client import ConsumeStatus, Message, MessageExt, Producer, PushConsumer

NAMESRV = "127.0.0.1:9876"


async def main() -> None:
    async with Producer("orders-producer", namesrv=NAMESRV) as producer:
        for order in ("order-1", "order-2"):
            for step in ("created", "paid", "shipped"):
                msg = Message("Orders", f"{order} {step}".encode(), properties={"amount": "120", "step": step})
                await producer.send_orderly(msg, sharding_key=order)  # one key -> one queue, in order

    done = asyncio.Event()
    seen: list[str] = []

    def on_paid(msgs: list[MessageExt]) -> ConsumeStatus:
        seen.extend(m.body.decode() for m in msgs)
        if len(seen) >= 2:
            done.set()
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer("paid-orders", namesrv=NAMESRV, consume_from="first", listener=on_paid)
    consumer.subscribe("Orders", "step = 'paid' AND amount > 100", expression_type="SQL92")
    async with consumer:
        await asyncio.wait_for(done.wait(), 30)
    print(seen)


if __name__ == "__main__":
    asyncio.run(main())
