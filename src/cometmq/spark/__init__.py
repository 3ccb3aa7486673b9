"""The PySpark data source for cometmq topics (``pip install 'cometmq[spark]'``).

    from cometmq.spark import register
    register(spark)                                  # or rely on discovery: see below
    df = spark.read.format("cometmq").option("namesrv", "127.0.0.1:9876").option("subscribe", "T").load()

PySpark (4.2+) also finds the source by itself: it imports every top-level module whose name starts with
``pyspark_`` and registers its ``DefaultSource``; cometmq ships ``pyspark_cometmq`` for that, so
``format("cometmq")`` works without ``register`` once the extra is installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cometmq.spark.options import OptionError
from cometmq.spark.schema import READ_COLUMNS, WRITE_COLUMNS, read_schema

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["READ_COLUMNS", "WRITE_COLUMNS", "CometMQDataSource", "OptionError", "read_schema", "register"]


def register(spark: SparkSession) -> None:
    """Register the ``cometmq`` format with ``spark`` (harmless when it is registered already)."""
    from cometmq.spark.source import CometMQDataSource

    spark.dataSource.register(CometMQDataSource)


def __getattr__(name: str) -> Any:
    if name == "CometMQDataSource":  # imports pyspark: only when asked for
        from cometmq.spark.source import CometMQDataSource

        return CometMQDataSource
    raise AttributeError(name)
