"""The parts of the Spark source that need no Spark: options, offset planning, record decoding."""

from __future__ import annotations

import itertools
import zlib

import pyarrow as pa
import pytest

from cometmq.client.message import MessageQueue
from cometmq.protocol.errors import ProtocolError
from cometmq.protocol.message import MessageRecord, SysFlag, encode_record
from cometmq.spark.decode import decode_records
from cometmq.spark.options import OptionError, parse_read, parse_write
from cometmq.spark.planning import QueueRange, from_json, limit_rows, should_wait, split_ranges, to_json
from cometmq.spark.resolve import DataLossError, NoOffsetForTimestampError, check_data_loss, resolve_bound, selects
from cometmq.spark.schema import arrow_schema, read_schema

NS = {"namesrv": "127.0.0.1:9876"}


# -- options ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("options", "streaming", "needle"), [
    ({"subscribe": "T"}, False, "namesrv is required"),
    ({**NS}, False, "one of the options subscribe"),
    ({**NS, "subscribe": "T", "assign": '{"T": [0]}'}, False, "subscribe and assign contradict"),
    ({**NS, "subscribe": "T", "bogus": "1"}, False, "unknown cometmq read option 'bogus'"),
    ({**NS, "subscribe": "T", "startingOffsets": "earliest", "startingTimestamp": "5"}, False,
     "startingOffsets and startingTimestamp contradict"),
    ({**NS, "subscribe": "T", "endingOffsets": "latest"}, True, "endingOffsets is for batch reads"),
    ({**NS, "subscribe": "T", "maxOffsetsPerTrigger": "10"}, False, "maxOffsetsPerTrigger is for streaming"),
    ({**NS, "subscribe": "T", "startingOffsets": "latest"}, False, "startingOffsets=latest makes no sense"),
    ({**NS, "subscribe": "T", "endingOffsets": "earliest"}, False, "endingOffsets=earliest makes no sense"),
    ({**NS, "subscribe": "T", "startingOffsets": '{"T": {"b:0": -1}}'}, False, "-1 (latest)"),
    ({**NS, "subscribe": "T", "startingOffsets": '{"T": {"b0": 1}}'}, False, "brokerName:queueId"),
    ({**NS, "subscribe": "T", "startingOffsets": '{"U": {"b:0": 1}}'}, False, "topics that are not read: U"),
    ({**NS, "subscribe": "T", "startingOffsets": "{nope"}, False, "valid JSON"),
    ({**NS, "subscribe": "T", "minPartitions": "0"}, False, "minPartitions='0' must be at least 1"),
    ({**NS, "subscribe": "T", "minPartitions": "2147483648"}, False, "minPartitions='2147483648' must be at most"),
    ({**NS, "subscribe": "T", "failOnDataLoss": "maybe"}, False, "failOnDataLoss='maybe'"),
    ({**NS, "subscribePattern": "("}, True, "not a regular expression"),
    ({**NS, "subscribe": "bad topic"}, False, "not a valid topic name"),
    ({**NS, "subscribe": "T", "expressionType": "SQL92"}, False, "SQL92 needs a subExpression"),
    ({**NS, "subscribe": "T", "expressionType": "XPATH", "subExpression": "a"}, False, "TAG or SQL92"),
    ({**NS, "assign": '{"T": []}'}, False, "non-empty list"),
    # Spark's Kafka source's remaining options
    ({**NS, "subscribe": "T", "startingTimestamp": "5", "startingOffsetsByTimestamp": '{"T": {"b:0": 5}}'}, False,
     "startingOffsetsByTimestamp and startingTimestamp contradict"),
    ({**NS, "subscribe": "T", "startingOffsets": "earliest", "startingOffsetsByTimestamp": '{"T": {"b:0": 5}}'},
     True, "startingOffsets and startingOffsetsByTimestamp contradict"),
    ({**NS, "subscribe": "T", "startingOffsetsByTimestamp": "{nope"}, False,
     "option startingOffsetsByTimestamp is not valid JSON"),
    ({**NS, "subscribe": "T", "startingOffsetsByTimestamp": '{"T": {"b:0": "x"}}'}, False,
     "startingOffsetsByTimestamp: timestamp of T b:0 is not an integer"),
    ({**NS, "subscribe": "T", "startingOffsetsByTimestamp": '{"T": {"b:0": -1}}'}, False,
     "startingOffsetsByTimestamp: timestamp -1 (latest) of T b:0 is not allowed"),
    ({**NS, "subscribe": "T", "startingOffsetsByTimestamp": '{"T": {"b:0": -7}}'}, True, "timestamp -7 of T b:0"),
    ({**NS, "subscribe": "T", "startingOffsetsByTimestamp": '{"T": {"0": 5}}'}, False,
     "option startingOffsetsByTimestamp: queue '0' in offsets JSON is not 'brokerName:queueId'"),
    ({**NS, "subscribe": "T", "startingOffsetsByTimestamp": '{"U": {"b:0": 5}}'}, False,
     "option startingOffsetsByTimestamp names topics that are not read: U"),
    ({**NS, "subscribe": "T", "startingOffsetsByTimestamp": '[1]'}, False, "startingOffsetsByTimestamp must be JSON"),
    ({**NS, "subscribe": "T", "endingOffsetsByTimestamp": '{"T": {"b:0": -2}}'}, False, "-2 (earliest)"),
    ({**NS, "subscribe": "T", "endingOffsetsByTimestamp": '{"T": {"b:0": 5}}'}, True,
     "endingOffsetsByTimestamp is for batch reads"),
    ({**NS, "subscribe": "T", "endingOffsets": "latest", "endingTimestamp": "5"}, False,
     "endingOffsets and endingTimestamp contradict"),
    ({**NS, "subscribe": "T", "startingTimestamp": "5", "startingOffsetsByTimestampStrategy": "skip"}, False,
     "startingOffsetsByTimestampStrategy='skip' must be error or latest"),
    ({**NS, "subscribe": "T", "startingOffsetsByTimestampStrategy": "latest"}, True,
     "startingOffsetsByTimestampStrategy only applies with startingTimestamp or startingOffsetsByTimestamp"),
    ({**NS, "subscribe": "T", "minOffsetsPerTrigger": "0"}, True, "minOffsetsPerTrigger='0' must be at least 1"),
    ({**NS, "subscribe": "T", "minOffsetsPerTrigger": "many"}, True, "minOffsetsPerTrigger='many' is not an integer"),
    ({**NS, "subscribe": "T", "minOffsetsPerTrigger": "10"}, False, "minOffsetsPerTrigger is for streaming"),
    ({**NS, "subscribe": "T", "maxTriggerDelay": "5s"}, True, "maxTriggerDelay only applies with minOffsetsPerTrigger"),
    ({**NS, "subscribe": "T", "minOffsetsPerTrigger": "5", "maxTriggerDelay": "soon"}, True,
     "maxTriggerDelay='soon' is not a duration"),
    ({**NS, "subscribe": "T", "minOffsetsPerTrigger": "5", "maxTriggerDelay": "-5s"}, True, "not a duration"),
    ({**NS, "subscribe": "T", "maxRecordsPerPartition": "0"}, False, "maxRecordsPerPartition='0' must be at least 1"),
    ({**NS, "subscribe": "T", "maxRecordsPerPartition": "1e3"}, True, "maxRecordsPerPartition='1e3' is not an integer"),
    ({**NS, "subscribe": "T", "includeHeaders": "perhaps"}, False, "includeHeaders='perhaps' is not true or false"),
    ({**NS, "subscribe": "T", "includeHeaders": "true", "includeProperties": "false"}, False,
     "includeHeaders and includeProperties contradict"),
])
def test_bad_read_options_name_the_option(options: dict[str, str], streaming: bool, needle: str) -> None:
    with pytest.raises(OptionError, match=None) as info:
        parse_read(options, streaming=streaming)
    assert needle in str(info.value)


@pytest.mark.parametrize(("options", "needle"), [
    ({**NS, "subscribe": "T", "startingOffsets": '{"T": {"b:\u00b2": 1}}'}, "option startingOffsets: queue 'b:²'"),
    ({**NS, "assign": '{"T": ["b:\u00b2"]}'}, "option assign: queue 'b:²'"),
    ({**NS, "assign": '{"T": ["b0"]}'}, "option assign: queue 'b0'"),
    ({**NS, "subscribe": "T", "startingOffsets": '{"T": {"b:0": ' + "9" * 5000 + "}}"}, "option startingOffsets"),
    ({**NS, "subscribe": "T", "minOffsetsPerTrigger": "5", "maxTriggerDelay": "9" * 400}, "option maxTriggerDelay"),
    ({**NS, "subscribe": "T", "requestTimeoutMs": "1" + "0" * 20}, "option requestTimeoutMs"),
])
def test_out_of_range_read_values_name_the_option(options: dict[str, str], needle: str) -> None:
    """Values that parse but cannot be used (a digit that is not 0-9, a number too large for a timeout or a
    float) are refused up front, naming the option: not a ValueError or OverflowError from deep inside a task."""
    with pytest.raises(OptionError) as info:
        parse_read(options, streaming=True)
    assert needle in str(info.value)
    with pytest.raises(OptionError, match="option sendTimeoutMs"):
        parse_write({**NS, "sendTimeoutMs": "1" + "0" * 20})


def test_read_options_defaults_and_case() -> None:
    batch = parse_read({"NAMESRV": "h:1", "Subscribe": "A, B,A", "STARTINGOFFSETS": '{"A": {"b:1": 5}}',
                        "includeproperties": "false", "subexpression": "x || y"}, streaming=False)
    assert batch.subscribe == ("A", "B")
    assert batch.starting.kind == "offsets" and batch.starting.offsets == {"A": {"b:1": 5}}
    assert batch.ending.kind == "latest" and not batch.include_properties and batch.filtered
    stream = parse_read({**NS, "subscribePattern": "A.*", "commitToGroup": "g1", "maxOffsetsPerTrigger": "7"},
                        streaming=True)
    assert stream.starting.kind == "latest" and stream.group == "g1" and stream.max_offsets_per_trigger == 7
    assert stream.topic_matches("Abc") and not stream.topic_matches("xA")
    ts = parse_read({**NS, "assign": '{"T": [0, "b:3"]}', "startingTimestamp": "1000"}, streaming=False)
    assert ts.assign == {"T": (0, "b:3")} and ts.starting.timestamp == 1000


def test_kafka_style_options_parse() -> None:
    batch = parse_read({**NS, "subscribe": "T,U",
                        "startingOffsetsByTimestamp": '{"T": {"b:0": 1000, "b:1": -2}}',
                        "endingOffsetsByTimestamp": '{"U": {"b:3": 2000, "c:0": -1}}',
                        "startingOffsetsByTimestampStrategy": "LATEST", "maxRecordsPerPartition": "500",
                        "includeHeaders": "false"}, streaming=False)
    assert batch.starting.kind == "timestamps" and batch.starting.offsets == {"T": {"b:0": 1000, "b:1": -2}}
    assert batch.starting.option == "startingOffsetsByTimestamp"
    assert batch.ending.kind == "timestamps" and batch.ending.offsets == {"U": {"b:3": 2000, "c:0": -1}}
    assert batch.timestamp_strategy == "latest" and batch.max_records_per_partition == 500
    assert not batch.include_properties
    assert parse_read({**NS, "subscribe": "T", "startingTimestamp": "7"}, streaming=False).timestamp_strategy == "error"
    stream = parse_read({**NS, "subscribe": "T", "minOffsetsPerTrigger": "50", "maxOffsetsPerTrigger": "80",
                         "startingOffsetsByTimestamp": '{"T": {"b:0": -1}}'}, streaming=True)
    assert (stream.min_offsets_per_trigger, stream.max_offsets_per_trigger) == (50, 80)
    assert stream.max_trigger_delay == 15 * 60  # Spark's Kafka source's default: 15m
    for raw, seconds in (("250ms", 0.25), ("30s", 30), ("2m", 120), ("1h", 3600), ("1500", 1.5), ("3 min", 180)):
        opts = parse_read({**NS, "subscribe": "T", "minOffsetsPerTrigger": "1", "maxTriggerDelay": raw},
                          streaming=True)
        assert opts.max_trigger_delay == seconds, raw
    same = parse_read({**NS, "subscribe": "T", "includeHeaders": "true", "includeProperties": "true"},
                      streaming=False)
    assert same.include_properties


def test_write_options() -> None:
    with pytest.raises(OptionError, match="unknown cometmq write option 'subscribe'"):
        parse_write({**NS, "subscribe": "T"})
    with pytest.raises(OptionError, match="batchSize"):
        parse_write({**NS, "batchSize": "x"})
    w = parse_write({**NS, "topic": "Out", "batchSize": "16", "checkpointLocation": "/tmp/x"})
    assert (w.topic, w.batch_size, w.retries) == ("Out", 16, 2)


# -- planning -----------------------------------------------------------------------------------------------------
def q(i: int, topic: str = "T") -> MessageQueue:
    return MessageQueue(topic, "b", i)


def test_offsets_json_round_trip_is_sorted() -> None:
    offsets = {q(2): 5, q(0, "A"): 1, q(1): 3}
    data = to_json(offsets)
    assert list(data) == ["A", "T"] and list(data["T"]) == ["b:1", "b:2"]
    assert from_json(data) == offsets
    with pytest.raises(OptionError):
        from_json({"T": {"b:1": "x"}})


def test_split_ranges_covers_every_offset_once() -> None:
    ranges = [QueueRange(q(0), 0, 1000), QueueRange(q(1), 10, 20), QueueRange(q(2), 5, 5)]
    assert [r.queue for r in split_ranges(ranges, None)] == [q(0), q(1)]
    pieces = split_ranges(ranges, 8)
    assert len(pieces) >= 8
    for queue, (lo, hi) in ((q(0), (0, 1000)), (q(1), (10, 20))):
        mine = [r for r in pieces if r.queue == queue]
        assert mine[0].start == lo and mine[-1].end == hi
        assert all(a.end == b.start for a, b in itertools.pairwise(mine))
    assert split_ranges(ranges, 8) == pieces  # deterministic


def test_split_ranges_max_records_per_partition() -> None:
    ranges = [QueueRange(q(0), 0, 1000), QueueRange(q(1), 10, 20), QueueRange(q(2), 5, 5)]
    pieces = split_ranges(ranges, None, 300)
    assert [(r.queue, r.start, r.end) for r in pieces] == [
        (q(0), 0, 250), (q(0), 250, 500), (q(0), 500, 750), (q(0), 750, 1000), (q(1), 10, 20)]
    assert len(split_ranges(ranges, None, 1000)) == 2  # exactly the maximum: not cut
    # with minPartitions too: at least that many pieces, none above the maximum
    both = split_ranges(ranges, 8, 300)
    assert len(both) >= 8 and max(r.size for r in both) <= 300
    for queue, (lo, hi) in ((q(0), (0, 1000)), (q(1), (10, 20))):
        mine = [r for r in both if r.queue == queue]
        assert mine[0].start == lo and mine[-1].end == hi
        assert all(a.end == b.start for a, b in itertools.pairwise(mine))
    assert max(r.size for r in split_ranges([QueueRange(q(0), 0, 7)], None, 1)) == 1


def test_should_wait_min_offsets_and_max_delay() -> None:
    start, latest = {q(0): 10, q(1): 0}, {q(0): 14, q(1): 3, q(2): 2}  # 4 + 3 + 2 (a new queue) = 9 waiting
    assert not should_wait(start, latest, 100, 60.0, 0.0, now=1000.0)  # the first trigger never waits
    assert should_wait(start, latest, 10, 60.0, 990.0, now=1000.0)  # 9 < 10 and only 10 s since the last one
    assert not should_wait(start, latest, 9, 60.0, 990.0, now=1000.0)  # 9 waiting is enough
    assert not should_wait(start, latest, 10, 60.0, 940.0, now=1000.0)  # the delay has passed


def test_stream_reader_admission_control() -> None:
    """latestOffset with minOffsetsPerTrigger, maxTriggerDelay and maxOffsetsPerTrigger, over fixed offsets."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

    from cometmq.spark.reader import CometStreamReader

    opts = parse_read({**NS, "subscribe": "T", "minOffsetsPerTrigger": "10", "maxOffsetsPerTrigger": "6",
                       "maxTriggerDelay": "1h"}, streaming=True)
    reader = CometStreamReader(opts, read_schema())
    start = to_json({q(0): 0, q(1): 0})
    backlog = {q(0): 4, q(1): 3}

    def latest(known: dict[MessageQueue, int]) -> tuple[dict[MessageQueue, int], dict[MessageQueue, int]]:
        return dict(known), {x: max(backlog[x], known.get(x, 0)) for x in backlog}

    reader._latest = latest  # type: ignore[method-assign]
    limit = reader.getDefaultReadLimit()
    assert limit == ReadMaxRows(6)
    first = reader.latestOffset(start, limit)  # the first trigger goes (as Kafka's), capped at 6
    assert sum(from_json(first).values()) == 6
    assert reader.latestOffset(first, limit) == first  # 1 waiting < 10: no batch
    assert reader.latestOffset(first, ReadAllAvailable()) == to_json(backlog)  # Spark's override wins
    backlog.update({q(0): 10, q(1): 10})
    assert sum(from_json(reader.latestOffset(first, limit)).values()) == 12  # 14 waiting: go, 6 at most
    reader._last_trigger = 0.0  # an hour ago or more: the delay passed
    backlog.update({q(0): 10, q(1): 11})
    assert sum(from_json(reader.latestOffset(to_json({q(0): 10, q(1): 10}), limit)).values()) == 21
    only_min = CometStreamReader(parse_read({**NS, "subscribe": "T", "minOffsetsPerTrigger": "3"}, streaming=True),
                                 read_schema())
    only_min._latest = latest  # type: ignore[method-assign]
    assert only_min.getDefaultReadLimit() == ReadMinRows(3)
    only_min._last_trigger = 1e18  # a trigger "just now"
    here = to_json({q(0): 10, q(1): 10})
    assert only_min.latestOffset(here, ReadMinRows(3)) == here  # 1 waiting
    assert only_min.latestOffset(here, ReadMinRows(1)) == to_json({q(0): 10, q(1): 11})
    only_min._target = {q(0): 10, q(1): 11}  # availableNow: the minimum never holds the run back
    assert only_min.latestOffset(here, ReadMinRows(3)) == to_json({q(0): 10, q(1): 11})


class FakeLink:
    """The offsets of queue i: [0, ends[i]); message k of every queue stored at time 1000 * (k + 1)."""

    def __init__(self, ends: dict[MessageQueue, int]) -> None:
        self.ends = ends

    def min_offsets(self, queues: list[MessageQueue]) -> dict[MessageQueue, int]:
        return {x: 0 for x in queues}

    def max_offsets(self, queues: list[MessageQueue]) -> dict[MessageQueue, int]:
        return {x: self.ends[x] for x in queues}

    def offsets_for_time(self, queues: list[MessageQueue], ts: int) -> dict[MessageQueue, int]:
        return {x: min(self.ends[x], max(0, -(-ts // 1000) - 1)) for x in queues}  # the end when none


def test_resolve_timestamps_and_the_no_match_strategy() -> None:
    link = FakeLink({q(0): 10, q(1): 3, q(2): 0})
    queues = sorted(link.ends, key=lambda x: x.queue_id)
    by_ts = parse_read({**NS, "subscribe": "T", "startingOffsetsByTimestamp": '{"T": {"b:0": 5000, "b:1": -2}}',
                        "endingOffsetsByTimestamp": '{"T": {"b:0": 7500, "b:1": 99000}}'}, streaming=False)
    got = resolve_bound(link, by_ts.starting, queues, missing=-2, strategy="error")  # type: ignore[arg-type]
    assert got == {q(0): 4, q(1): 0, q(2): 0}  # b:2 left out: the default (earliest)
    ends = resolve_bound(link, by_ts.ending, queues, missing=-1, strategy="latest")  # type: ignore[arg-type]
    assert ends == {q(0): 7, q(1): 3, q(2): 0}  # no message at or after 99000 in b:1: its end
    late = parse_read({**NS, "subscribe": "T", "startingTimestamp": "4000"}, streaming=False)
    with pytest.raises(NoOffsetForTimestampError, match=r"startingTimestamp: .*T b:1 \(timestamp 4000\); T b:2"):
        resolve_bound(link, late.starting, queues, missing=-2, strategy="error")  # type: ignore[arg-type]
    assert resolve_bound(link, late.starting, queues, missing=-2,  # type: ignore[arg-type]
                         strategy="latest") == {q(0): 3, q(1): 3, q(2): 0}
    stray = parse_read({**NS, "subscribe": "T", "startingOffsetsByTimestamp": '{"T": {"b:9": 5}}'}, streaming=False)
    with pytest.raises(OptionError, match="startingOffsetsByTimestamp names queue b:9 of T, which is not read"):
        resolve_bound(link, stray.starting, queues, missing=-2, strategy="error")  # type: ignore[arg-type]


def test_write_queue_column() -> None:
    from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

    from cometmq.client.errors import InvalidArgumentError
    from cometmq.spark.options import WriteOptions
    from cometmq.spark.writer import check_write_schema, pick_queue, to_messages

    def schema(**cols: object) -> StructType:
        return StructType([StructField(name, kind) for name, kind in cols.items()])  # type: ignore[arg-type]

    w = WriteOptions(namesrv="h:1", topic="T")
    text, i32, i64 = StringType(), IntegerType(), LongType()
    for cols, needle in ((schema(body=text, queue=i32, queueId=i32), "'queue' and 'queueId' contradict"),
                         (schema(body=text, brokerName=text), "'brokerName' only means something"),
                         (schema(body=text, queueId=text), "column 'queueId' is string")):
        with pytest.raises(OptionError, match=needle):
            check_write_schema(cols, w)
    check_write_schema(schema(body=text, queue=i64, brokerName=text), w)
    batch = pa.RecordBatch.from_pydict({"body": ["a", "b"], "queue": [2, None]})
    rows = to_messages(batch, "T")
    assert (rows[0].queue_id, rows[0].broker, rows[1].queue_id) == (2, None, None)
    bad = pa.RecordBatch.from_pydict({"body": ["a"], "queueId": [1], "shardingKey": ["k"]})
    with pytest.raises(InvalidArgumentError, match="row 0 of the task: queueId and shardingKey contradict"):
        to_messages(bad, "T")
    with pytest.raises(InvalidArgumentError, match="queueId -1 is negative"):
        to_messages(pa.RecordBatch.from_pydict({"body": ["a"], "queueId": [-1]}), "T")
    qs = [MessageQueue("T", "a", 0), MessageQueue("T", "a", 1), MessageQueue("T", "b", 0)]
    assert pick_queue(qs, "T", None, 1, "r") == qs[1]
    assert pick_queue(qs, "T", "b", 0, "r") == qs[2]
    with pytest.raises(InvalidArgumentError, match="queue 0 on several brokers"):
        pick_queue(qs, "T", None, 0, "r")
    with pytest.raises(InvalidArgumentError, match=r"no writable queue 5 .*its queues: a:0, a:1, b:0"):
        pick_queue(qs, "T", None, 5, "r")


def test_limit_rows_shares_by_backlog() -> None:
    start = {q(0): 0, q(1): 100, q(2): 7}
    latest = {q(0): 300, q(1): 200, q(2): 7}
    end = limit_rows(start, latest, 100)
    assert sum(end[x] - start[x] for x in start) == 100
    assert (end[q(0)], end[q(1)], end[q(2)]) == (75, 125, 7)  # 300 and 100 waiting: 3 to 1
    assert limit_rows(start, latest, 10_000) == latest
    assert limit_rows(start, latest, 1) in ({**start, q(0): 1}, {**start, q(1): 101})


def test_data_loss_check() -> None:
    starts, mins = {q(0): 0, q(1): 50}, {q(0): 40, q(1): 10}
    with pytest.raises(DataLossError, match=r"T b:0: offsets 0\.\.39"):
        check_data_loss(starts, mins, fail=True)
    assert check_data_loss(starts, mins, fail=False) == {q(0): 40, q(1): 50}


def test_which_unrouted_queues_the_options_still_select() -> None:
    """A stream keeps the offset of a queue gone from the route only if its options still name it (not one of a
    topic dropped from them on a restart)."""
    def sel(**options: str) -> list[MessageQueue]:
        opts = parse_read({**NS, **options}, streaming=True)
        every = [MessageQueue(t, b, i) for t in ("T", "T2", "U") for b in ("a", "b") for i in (0, 1)]
        return [x for x in every if selects(opts, x)]

    assert sel(subscribe="T,U") == [x for x in sel(subscribePattern=".*") if x.topic != "T2"]
    assert {x.topic for x in sel(subscribePattern="T.?")} == {"T", "T2"}
    assert sel(assign='{"T": [1, "b:0"]}') == [MessageQueue("T", "a", 1), MessageQueue("T", "b", 0),
                                                MessageQueue("T", "b", 1)]


# -- decoding -------------------------------------------------------------------------------------------------------
def record(offset: int, body: bytes, props: dict[str, str], sys_flag: int = 0) -> bytes:
    return encode_record(MessageRecord(topic="T", body=body, queue_id=3, queue_offset=offset,
                                       physical_offset=1000 + offset, sys_flag=sys_flag,
                                       born_timestamp=1_700_000_000_123, store_timestamp=1_700_000_000_456,
                                       store_host=("10.0.0.1", 10911), reconsume_times=offset % 2,
                                       properties=props))


def test_decode_records_to_arrow() -> None:
    buf = b"".join([
        record(7, b"hello", {"TAGS": "A", "KEYS": "k1 k2", "UNIQ_KEY": "U7", "WAIT": "true", "color": "red"}),
        record(8, zlib.compress(b"z" * 50), {"UNIQ_KEY": "U8"}, int(SysFlag.COMPRESSED)),
        record(9, b"", {}),
    ])
    schema = arrow_schema(read_schema())
    batch = decode_records(buf, "T", "broker-x", schema)
    assert batch.schema.equals(schema)
    rows = batch.to_pylist()
    assert [r["queueOffset"] for r in rows] == [7, 8, 9]
    assert rows[0]["body"] == b"hello" and rows[1]["body"] == b"z" * 50 and rows[2]["body"] == b""
    assert (rows[0]["tags"], rows[0]["keys"], rows[0]["msgId"]) == ("A", "k1 k2", "U7")
    assert rows[0]["properties"] == [("color", "red")] and rows[1]["properties"] == []
    assert rows[1]["tags"] is None and rows[1]["msgId"] == "U8"
    assert rows[2]["msgId"] == "0A00000100002A9F" + f"{1009:016X}"  # no UNIQ_KEY: the offset id
    assert rows[0]["brokerName"] == "broker-x" and rows[0]["queueId"] == 3 and rows[1]["reconsumeTimes"] == 0
    assert rows[0]["storeTimestamp"].timestamp() == pytest.approx(1_700_000_000.456)
    lean = decode_records(buf, "T", "b", arrow_schema(read_schema(include_properties=False)))
    assert "properties" not in lean.schema.names and lean.num_rows == 3


@pytest.mark.parametrize("helper", ["c", "python"])
def test_decode_inflates_a_compressed_body_to_16_mib_at_most(helper: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A COMPRESSED body inflated whole: 64 KiB stored inflated to 64 MiB (4 MiB stored: ~4 GiB) in the executor's
    memory, for each read of it. Now to 16 MiB at most (the SDK consumers' default); past it, as stored."""
    from cometmq.spark import decode

    if helper == "python":
        monkeypatch.setattr(decode, "C_HELPER", None)
    at_limit, bomb = b"a" * (16 << 20), bytes(64 << 20)
    stored = [zlib.compress(at_limit), zlib.compress(bomb)]
    buf = b"".join(record(i, body, {}, int(SysFlag.COMPRESSED)) for i, body in enumerate(stored))
    rows = decode_records(buf, "T", "b", arrow_schema(read_schema())).to_pylist()
    assert [r["body"] for r in rows] == [at_limit, stored[1]]


@pytest.mark.parametrize("cut", [1, 50, 95])
def test_decode_refuses_truncated_or_corrupt_answers(cut: int) -> None:
    buf = record(1, b"x" * 20, {"UNIQ_KEY": "u"}) * 2
    schema = arrow_schema(read_schema())
    with pytest.raises(ProtocolError):
        decode_records(buf[:-cut], "T", "b", schema)
    bad = bytearray(buf)
    bad[len(buf) // 2 + 4] ^= 0xFF  # the second record's magic code
    with pytest.raises(ProtocolError, match="magic"):
        decode_records(bytes(bad), "T", "b", schema)
    assert decode_records(b"", "T", "b", schema).num_rows == 0
    assert isinstance(decode_records(buf, "T", "b", schema), pa.RecordBatch)


def _reference_row(raw_props: bytes) -> tuple[str | None, str | None, str | None, list[tuple[str, str]]]:
    """(tags, keys, uniq key, map entries) of one record's property bytes, one pair at a time."""
    named: list[tuple[str, str]] = []
    for item in raw_props.decode("utf-8").split("\x02"):
        name, sep, value = item.partition("\x01")
        if sep and name:
            named.append((name, value))
    last = dict(named)
    hidden = {"TAGS", "KEYS", "UNIQ_KEY", "WAIT", "DELAY", "TIMER_DELIVER_MS", "TIMER_DELAY_MS", "TIMER_DELAY_SEC"}
    return last.get("TAGS"), last.get("KEYS"), last.get("UNIQ_KEY"), [kv for kv in named if kv[0] not in hidden]


@pytest.mark.parametrize("seed", range(6))
def test_decode_matches_a_record_by_record_reading(seed: int) -> None:
    """The vectorized decoding against a plain per-record reading of the same bytes, on awkward input: names
    that share prefixes or lengths with the well-known ones, separators inside values, pairs without a
    separator or a name, strings not ending with the pair separator, bodies holding the magic code."""
    import random

    from cometmq.protocol.message import MAGIC_CODE, encode_parts

    rng = random.Random(seed)
    names = ["TAGS", "KEYS", "UNIQ_KEY", "WAIT", "DELAY", "TIMER_DELIVER_MS", "TIMER_DELAY_MX", "TAG", "TAGSX",
             "UNIQ_KEYS", "KEYZ", "", "a", "source", "ÿname", "TIMER_DELAY_SEC"]
    magic = MAGIC_CODE.to_bytes(4, "big")
    awkward = seed % 2 == 1  # odd seeds: separators in values, unterminated strings, nameless pairs
    recs, props_raw, bodies = [], [], []
    for i in range(300):
        pairs = []
        for _ in range(rng.randrange(0, 6)):
            value = rng.choice(["v", "", "TAGS", f"x{i}", "héllo"])
            if awkward and rng.random() < 0.2:
                value += "\x01more"
            item = f"{rng.choice(names)}\x01{value}"
            if awkward and rng.random() < 0.1:
                item = rng.choice(["noseparator", "", "\x01nameless"])
            pairs.append(item)
        text = "".join(p + "\x02" for p in pairs)
        if awkward and text and rng.random() < 0.3:
            text = text[:-1]
        props = text.encode("utf-8")
        body = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40)))
        if seed >= 2 and rng.random() < 0.2:
            body += magic + (300).to_bytes(4, "big") + body
        recs.append(encode_parts(topic=b"T", body=body, properties=props, queue_id=1, queue_offset=i,
                                 physical_offset=i * 10, born_timestamp=1_700_000_000_000 + i,
                                 store_timestamp=1_700_000_000_500 + i))
        props_raw.append(props)
        bodies.append(body)
    batch = decode_records(b"".join(recs), "T", "b", arrow_schema(read_schema()))
    rows = batch.to_pylist()
    assert len(rows) == len(recs)
    for i, (row, props, body) in enumerate(zip(rows, props_raw, bodies, strict=True)):
        tags, keys, uniq, entries = _reference_row(props)
        assert (row["queueOffset"], row["body"], row["tags"], row["keys"]) == (i, body, tags, keys), i
        assert row["properties"] == entries, i
        if uniq is not None:
            assert row["msgId"] == uniq, i
        assert int(row["bornTimestamp"].timestamp() * 1000) == 1_700_000_000_000 + i
