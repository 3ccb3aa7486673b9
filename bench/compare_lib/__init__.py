"""``bench/compare``: the same workloads against cometmq, Redis streams, NATS JetStream and RabbitMQ streams.

Modules: ``servers`` starts and stops each broker on 127.0.0.1 (by PID), ``clients/`` drives each with its
standard Python client, ``driver`` is the client process (one per broker session, commands on stdin),
``run`` orchestrates repeats and alternation, ``report`` turns results into JSON, markdown and plots.
"""
