"""``cometmq bench``: load tools against any nameserver, each printing a JSON line of results (cometmq.bench_tool)."""

from __future__ import annotations

from typing import Annotated

import typer

bench_app = typer.Typer(no_args_is_help=True, help="Load tools against any nameserver (a JSON line of results).")


@bench_app.command("produce")
def bench_produce(
    namesrv: Annotated[str, typer.Option(help="nameserver host:port")] = "127.0.0.1:9876",
    topic: Annotated[str, typer.Option()] = "BenchTopic",
    count: Annotated[int, typer.Option(min=1)] = 100_000,
    size: Annotated[int, typer.Option(min=1, help="body bytes")] = 100,
    batch: Annotated[int, typer.Option(min=1, help="messages per request")] = 64,
    concurrency: Annotated[int, typer.Option(min=1, help="requests in flight")] = 4,
) -> None:
    """Send COUNT messages as fast as the broker acknowledges them."""
    from cometmq import bench_tool

    bench_tool.run(bench_tool.produce(namesrv, topic, count, size, batch, concurrency))


@bench_app.command("consume")
def bench_consume(
    namesrv: Annotated[str, typer.Option(help="nameserver host:port")] = "127.0.0.1:9876",
    topic: Annotated[str, typer.Option()] = "BenchTopic",
    group: Annotated[str, typer.Option()] = "cometmq-bench-consumer",
    count: Annotated[int, typer.Option(min=1)] = 100_000,
    mode: Annotated[str, typer.Option(help="lite (pull) or push")] = "lite",
) -> None:
    """Consume COUNT messages from the start of the topic."""
    from cometmq import bench_tool

    if mode not in ("lite", "push"):
        raise typer.BadParameter("mode must be lite or push", param_hint="--mode")
    bench_tool.run(bench_tool.consume(namesrv, topic, group, count, mode))


@bench_app.command("latency")
def bench_latency(
    namesrv: Annotated[str, typer.Option(help="nameserver host:port")] = "127.0.0.1:9876",
    topic: Annotated[str, typer.Option()] = "BenchLatency",
    count: Annotated[int, typer.Option(min=1)] = 1000,
    interval_ms: Annotated[float, typer.Option(min=0.1)] = 2.0,
) -> None:
    """Send one message every INTERVAL_MS to an idle push consumer; report send-to-listener latency."""
    from cometmq import bench_tool

    bench_tool.run(bench_tool.latency(namesrv, topic, count, interval_ms))
