"""The same SDK without asyncio: blocking twins that run on one shared background loop.

Run `cometmq serve` first, then: python examples/blocking_api.py
"""

from cometmq.client import Message
from cometmq.client.sync import SyncLitePullConsumer, SyncProducer

NAMESRV = "127.0.0.1:9876"

with SyncProducer("blocking-producer", namesrv=NAMESRV) as producer:
    results = producer.send_batch([Message("BlockingTopic", f"item {i}".encode()) for i in range(100)])
    print("sent", len(results), "messages in one batch")

with SyncLitePullConsumer("blocking-reader", namesrv=NAMESRV, consume_from="first") as consumer:
    consumer.subscribe("BlockingTopic")
    total = 0
    while total < 100:
        batch = consumer.poll(timeout=5.0)
        total += len(batch)
    consumer.commit()
    print("read", total, "messages")
