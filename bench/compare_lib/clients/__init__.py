"""One client driver per system, each with the system's standard Python client (imported lazily)."""

from __future__ import annotations

from typing import Any

from compare_lib.clients.base import BenchClient


def client_for(system: str, cfg: dict[str, Any]) -> BenchClient:
    if system in ("cometmq", "cometmq-sync"):
        from compare_lib.clients.comet import CometClient

        return CometClient(cfg)
    if system == "redis":
        from compare_lib.clients.redis_streams import RedisClient

        return RedisClient(cfg)
    if system in ("nats", "nats-sync"):
        from compare_lib.clients.nats_js import NatsClient

        return NatsClient(cfg)
    if system == "rabbitmq":
        from compare_lib.clients.rabbit_streams import RabbitClient

        return RabbitClient(cfg)
    raise ValueError(f"unknown system {system!r}")
