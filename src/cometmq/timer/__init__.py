"""Timer messages with any delay (RocketMQ 5): TimerLog, TimerWheel, the enqueue and dequeue services.

``wheel`` and ``timerlog`` are pure structures (no asyncio, no sockets); ``service`` runs the
pipelines as tasks on the broker's event loop; ``message`` holds the record rewrites.
"""
