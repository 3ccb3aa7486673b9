"""The web dashboard (docs/dashboard.md): cluster, topics, consumer groups, messages, timers and POP, with live
charts and confirmed actions; served by ``cometmq dashboard`` against any cluster, or by a broker
(``--dashboard-port``). It reads the cluster through the SDK's admin client only. Needs the ``dashboard`` extra
(aiohttp, Jinja2)."""

from cometmq.dashboard.app import DashboardServer, create_app, start_dashboard

__all__ = ["DashboardServer", "create_app", "start_dashboard"]
