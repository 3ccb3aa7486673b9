"""``cometmq admin``: operator commands against running brokers, through a nameserver (``-n`` or
``$NAMESRV_ADDR``) or one address: RocketMQ's mqadmin verbs with its option letters, built on the SDK's
``Admin``. The verbs live by area: topics, groups (and offsets), messages, brokers, timer, ha."""

from cometmq.cli_admin import acl, brokers, groups, ha, messages, timer, topics  # noqa: F401 - they register verbs
from cometmq.cli_admin._common import admin_app

__all__ = ["admin_app"]
