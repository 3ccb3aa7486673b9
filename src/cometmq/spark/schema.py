"""The row schema of a cometmq topic read through Spark, and the columns a write accepts.

Reading yields one row per message:

=================  ==============================  ==========================================================
column             Spark type                      what
=================  ==============================  ==========================================================
topic              string                          the topic read
brokerName         string                          the broker that owns the queue
queueId            int                             the queue within that broker
queueOffset        long                            the message's offset in its queue
msgId              string                          the producer's unique id (UNIQ_KEY), else the offset id
tags               string (null: none)             the message's tag
keys               string (null: none)             its keys, space separated, as stored
body               binary                          the body (inflated; as stored past 16 MiB inflated)
properties         map<string,string>              the other properties (left out: ``includeProperties``)
bornTimestamp      timestamp                       when the producer made it
storeTimestamp     timestamp                       when the broker stored it
reconsumeTimes     int                             redelivery count (0 for a first delivery)
=================  ==============================  ==========================================================

The properties map leaves out what has a column of its own or only steers delivery (TAGS, KEYS, UNIQ_KEY, WAIT,
DELAY and the timer keys), so a row read from one topic can be written to another unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cometmq.protocol.properties import (
    DELAY,
    KEYS,
    TAGS,
    TIMER_DELAY_MS,
    TIMER_DELAY_SEC,
    TIMER_DELIVER_MS,
    UNIQ_KEY,
    WAIT,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

__all__ = [
    "HIDDEN_PROPERTIES",
    "READ_COLUMNS",
    "WRITE_COLUMNS",
    "arrow_schema",
    "read_schema",
]

#: the read schema, in order: (name, Spark SQL type)
READ_COLUMNS: tuple[tuple[str, str], ...] = (
    ("topic", "string"),
    ("brokerName", "string"),
    ("queueId", "int"),
    ("queueOffset", "bigint"),
    ("msgId", "string"),
    ("tags", "string"),
    ("keys", "string"),
    ("body", "binary"),
    ("properties", "map<string,string>"),
    ("bornTimestamp", "timestamp"),
    ("storeTimestamp", "timestamp"),
    ("reconsumeTimes", "int"),
)

#: properties that are never repeated in the ``properties`` column (they have a column, or steer delivery)
HIDDEN_PROPERTIES: frozenset[str] = frozenset(
    {TAGS, KEYS, UNIQ_KEY, WAIT, DELAY, TIMER_DELIVER_MS, TIMER_DELAY_MS, TIMER_DELAY_SEC})

#: columns a write understands -> the Spark type names each may have
WRITE_COLUMNS: dict[str, frozenset[str]] = {
    "body": frozenset({"binary", "string"}),
    "topic": frozenset({"string"}),
    "tags": frozenset({"string"}),
    "keys": frozenset({"string", "array<string>"}),
    "properties": frozenset({"map<string,string>"}),
    "shardingKey": frozenset({"string", "int", "bigint"}),
    "deliverAt": frozenset({"timestamp", "timestamp_ntz", "bigint"}),
    "delay": frozenset({"int", "bigint", "double", "float"}),
    "queueId": frozenset({"int", "bigint"}),
    "queue": frozenset({"int", "bigint"}),  # another name for queueId (Spark's Kafka sink has "partition")
    "brokerName": frozenset({"string"}),
}


def read_schema(include_properties: bool = True) -> StructType:
    """The Spark schema of rows read from cometmq."""
    from pyspark.sql.types import (
        BinaryType,
        DataType,
        IntegerType,
        LongType,
        MapType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    kinds: dict[str, DataType] = {"string": StringType(), "int": IntegerType(), "bigint": LongType(),
                                  "binary": BinaryType(), "timestamp": TimestampType(),
                                  "map<string,string>": MapType(StringType(), StringType())}
    return StructType([StructField(name, kinds[kind]) for name, kind in READ_COLUMNS
                       if include_properties or name != "properties"])


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark expects for ``schema`` (what ``read()`` must yield, field for field)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")
