"""``CometMQDataSource``: the PySpark data source named ``cometmq``."""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from cometmq.spark.options import OptionError, parse_read, parse_write
from cometmq.spark.reader import CometBatchReader, CometStreamReader
from cometmq.spark.schema import read_schema
from cometmq.spark.writer import CometBatchWriter, CometStreamWriter, check_write_schema

__all__ = ["CometMQDataSource"]


class CometMQDataSource(DataSource):
    """Read and write cometmq (RocketMQ) topics: ``spark.read.format("cometmq")``, ``readStream``,
    ``df.write`` and ``writeStream``. Options and row schema: docs/spark.md."""

    @classmethod
    def name(cls) -> str:
        return "cometmq"

    def schema(self) -> StructType:
        # Only the properties switch changes the schema; a bad value is reported by the reader.
        # (includeHeaders, as Spark's Kafka source names it, is another name for includeProperties.)
        raw = str(self.options.get("includeProperties", self.options.get("includeHeaders", "true"))).strip().lower()
        return read_schema(include_properties=raw not in ("false", "0", "no"))

    def _check_schema(self, schema: StructType) -> None:
        expected = self.schema()
        if schema != expected:
            raise OptionError("the cometmq source has a fixed schema; do not pass .schema(...) "
                              f"(expected {expected.simpleString()})")

    def reader(self, schema: StructType) -> DataSourceReader:
        self._check_schema(schema)
        return CometBatchReader(parse_read(self.options, streaming=False), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        self._check_schema(schema)
        return CometStreamReader(parse_read(self.options, streaming=True), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise OptionError("cometmq topics can only be appended to: use mode('append')")
        opts = parse_write(self.options)
        check_write_schema(schema, opts)
        return CometBatchWriter(opts)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        opts = parse_write(self.options)
        check_write_schema(schema, opts)
        return CometStreamWriter(opts)
