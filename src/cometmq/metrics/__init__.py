"""Broker metrics for Prometheus under RocketMQ 5's names and labels (docs/operations.md, "Metrics").

Needs the ``metrics`` extra (prometheus-client); the broker itself does not import this package.
"""

from cometmq.metrics.exporter import MetricsExporter, start_exporter

__all__ = ["MetricsExporter", "start_exporter"]
