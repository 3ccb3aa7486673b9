"""Which topic names are the system's: one owner (protocol/names.py), read by the broker, the gRPC endpoint, the
metrics, the dashboard and the Spark source."""

from __future__ import annotations

import pytest

from cometmq.protocol.names import SYSTEM_TOPICS, is_system_topic


@pytest.mark.parametrize("topic", [*sorted(SYSTEM_TOPICS), "rmq_sys_wheel_timer", "rmq_sys_POP_LOG"])
def test_rocketmqs_system_topics(topic: str) -> None:
    assert is_system_topic(topic)


@pytest.mark.parametrize("topic", ["TBW1020", "orders", "%RETRY%g", "RMQ_SYS_TRACE_TOPIC_X", "Rmq_sys_x"])
def test_other_names_are_not_system_topics(topic: str) -> None:
    # TopicValidator's test is exact: a set and a case-sensitive prefix (retry and DLQ topics are users')
    assert not is_system_topic(topic)


def test_the_spark_source_leaves_out_system_and_group_topics() -> None:
    pytest.importorskip("pyspark")
    from cometmq.spark.link import is_system_topic as spark_skips

    for topic in ("TBW102", "CHECKPOINT_TOPIC", "rmq_sys_x", "%RETRY%g", "%DLQ%g", "RMQ_SYS_TRACE_TOPIC"):
        assert spark_skips(topic), topic
    for topic in ("orders", "TBW1020", "SCHEDULE_TOPIC_XXXX_mine"):  # (a prefix match used to skip these)
        assert not spark_skips(topic), topic
