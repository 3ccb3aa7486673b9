"""Lets PySpark find the ``cometmq`` data source by itself.

PySpark 4 looks, once per session, for top-level modules named ``pyspark_*`` that define ``DefaultSource``
(a DataSource subclass) and registers each under its ``name()``; this is that module for cometmq.
"""

from cometmq.spark.source import CometMQDataSource as DefaultSource

__all__ = ["DefaultSource"]
