"""The options of the cometmq Spark source and sink: parsed once, checked once, with errors that name them.

Spark hands a data source its options case-insensitively; so does this module. An unknown option, a bad value,
or two options that contradict each other raise :class:`OptionError` before any task runs.
"""

from __future__ import annotations

import json
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from cometmq.client.admin import check_group, check_topic
from cometmq.client.errors import InvalidArgumentError
from cometmq.client.instance import parse_namesrv
from cometmq.net.tls import client_context

__all__ = [
    "EARLIEST",
    "LATEST",
    "Bound",
    "OptionError",
    "ReadOptions",
    "TlsOptions",
    "WriteOptions",
    "parse_read",
    "parse_write",
    "queue_key",
    "split_queue_key",
]

#: the JSON offsets' stand-ins for "the queue's first offset" and "its end", as Spark's Kafka source has them
EARLIEST = -2
LATEST = -1

#: options Spark itself may pass down with a query's options; they mean nothing to cometmq
_SPARK_OWN = frozenset({"checkpointlocation", "queryname", "path"})

#: TLS towards the nameservers and brokers: RocketMQ's client keys (tls.enable, tls.client.*) in their camelCase
#: form, the one broker.conf also takes (net/tls.py), with ``tls`` for tls.enable
_TLS_OPTIONS = ("tls", "tlsClientTrustCertPath", "tlsClientAuthServer", "tlsClientCertPath", "tlsClientKeyPath",
                "tlsClientKeyPassword")
_READ_OPTIONS = ("namesrv", "subscribe", "subscribePattern", "assign", "startingOffsets", "endingOffsets",
                 "startingTimestamp", "endingTimestamp", "startingOffsetsByTimestamp", "endingOffsetsByTimestamp",
                 "startingOffsetsByTimestampStrategy", "maxOffsetsPerTrigger", "minOffsetsPerTrigger",
                 "maxTriggerDelay", "minPartitions", "maxRecordsPerPartition", "failOnDataLoss", "subExpression",
                 "expressionType", "includeProperties", "includeHeaders", "commitToGroup", "consumerGroup",
                 "requestTimeoutMs", "accessKey", "secretKey", *_TLS_OPTIONS)
_WRITE_OPTIONS = ("namesrv", "topic", "producerGroup", "batchSize", "maxInFlight", "sendTimeoutMs", "retries",
                  "requestTimeoutMs", "accessKey", "secretKey", "transactional", "commitTopic", "transactionTimeoutMs",
                  *_TLS_OPTIONS)

#: the longest request timeout (requestTimeoutMs, sendTimeoutMs): a day; sockets take no more than that anyway
MAX_TIMEOUT_MS = 86_400_000

#: transactionTimeoutMs: how long a transactional write's halves wait before the broker may ask about them and,
#: after its transactionCheckMax checks, discard them (Flink's Kafka sink sets transaction.timeout.ms to 1 h)
DEFAULT_TRANSACTION_TIMEOUT_MS = 3_600_000
#: the shortest transactionTimeoutMs (the halves' immunity before this option)
MIN_TRANSACTION_TIMEOUT_MS = 60_000

#: where the exactly-once sink records the micro-batches it commits (see cometmq.spark.exactly_once)
DEFAULT_COMMIT_TOPIC = "cometmq-spark-commits"


class OptionError(ValueError):
    """A cometmq source or sink option that cannot be used; the message names it."""


def queue_key(broker_name: str, queue_id: int) -> str:
    """The key of a queue in offsets JSON: ``"brokerName:queueId"``."""
    return f"{broker_name}:{queue_id}"


def split_queue_key(key: str) -> tuple[str, int]:
    broker, sep, qid = key.rpartition(":")
    if not sep or not broker or not (qid.isascii() and qid.isdigit()):  # (int() refuses some other digits)
        raise OptionError(f"queue {key!r} in offsets JSON is not 'brokerName:queueId'")
    return broker, int(qid)


@dataclass(frozen=True)
class Bound:
    """Where reading starts or ends: ``earliest``, ``latest``, a timestamp (epoch ms) for every queue, per-queue
    offsets ``{topic: {"broker:queueId": offset}}`` or per-queue timestamps in the same shape (``timestamps``;
    ``offsets`` then holds them). In both JSON forms -2 = earliest, -1 = latest."""

    kind: Literal["earliest", "latest", "timestamp", "offsets", "timestamps"]
    timestamp: int = 0
    offsets: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    #: the option it came from (for error messages)
    option: str = ""

    def describe(self) -> str:
        if self.kind == "timestamp":
            return f"timestamp {self.timestamp}"
        if self.kind == "offsets":
            return json.dumps(self.offsets, sort_keys=True)
        if self.kind == "timestamps":
            return "timestamps " + json.dumps(self.offsets, sort_keys=True)
        return self.kind


@dataclass(frozen=True)
class TlsOptions:
    """Options ``tls=true`` and ``tlsClient*``: every connection to the nameservers and brokers uses TLS. The paths
    travel as given and are opened where the clients run: on the driver and on each executor."""

    #: PEM CA certificate(s) the broker's certificate is verified against (None: the system's CAs)
    trust_cert_path: str | None = None
    #: verify the broker's certificate and that it names the address dialled
    auth_server: bool = True
    #: a client certificate (PEM chain) and its private key, for brokers that ask for one
    cert_path: str | None = None
    key_path: str | None = None
    key_password: str | None = field(default=None, repr=False)

    def context(self) -> ssl.SSLContext:
        """The clients' context; a file that does not load raises OptionError naming its option."""
        try:
            ctx = client_context(ca_file=self.trust_cert_path, insecure=not self.auth_server)
        except (OSError, ssl.SSLError) as exc:
            raise OptionError(f"option tlsClientTrustCertPath={self.trust_cert_path!r}: cannot load it as PEM CA "
                              f"certificate(s): {exc}") from None
        if self.cert_path:
            try:
                # never None: OpenSSL would prompt on the terminal for an encrypted key's password
                ctx.load_cert_chain(self.cert_path, self.key_path, self.key_password or "")
            except (OSError, ssl.SSLError) as exc:
                raise OptionError(f"options tlsClientCertPath={self.cert_path!r} and tlsClientKeyPath="
                                  f"{self.key_path!r}: cannot load the client certificate and its key (a PEM chain "
                                  "and the matching private key; an encrypted key needs the right "
                                  f"tlsClientKeyPassword): {exc}") from None
        return ctx


@dataclass(frozen=True)
class ReadOptions:
    namesrv: str
    subscribe: tuple[str, ...] = ()
    pattern: str | None = None
    #: topic -> queue selectors (an int: that queue id on every broker; "broker:id": one queue)
    assign: Mapping[str, tuple[int | str, ...]] | None = None
    starting: Bound = Bound("earliest")
    ending: Bound = Bound("latest")
    #: startingOffsetsByTimestampStrategy: what a queue with no message at or after its starting timestamp
    #: does: "error" fails the read, "latest" starts it at its end
    timestamp_strategy: Literal["error", "latest"] = "error"
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    #: maxTriggerDelay in seconds (with minOffsetsPerTrigger): a trigger runs after this long even with fewer
    max_trigger_delay: float = 15 * 60.0
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    fail_on_data_loss: bool = True
    expression: str = "*"
    expression_type: str = "TAG"
    include_properties: bool = True
    commit_to_group: str | None = None
    group: str = "cometmq-spark"
    timeout: float = 10.0
    #: (accessKey, secretKey): every request is signed (brokers with aclEnable=true; docs/security.md)
    credentials: tuple[str, str] | None = None
    #: TLS settings (None: plaintext)
    tls: TlsOptions | None = None

    @property
    def filtered(self) -> bool:
        return self.expression_type != "TAG" or self.expression.strip() not in ("", "*")

    def topic_matches(self, topic: str) -> bool:
        if self.pattern is not None:
            return re.fullmatch(self.pattern, topic) is not None
        if self.assign is not None:
            return topic in self.assign
        return topic in self.subscribe


@dataclass(frozen=True)
class WriteOptions:
    namesrv: str
    topic: str | None = None
    producer_group: str = "cometmq-spark-writer"
    batch_size: int = 256
    max_in_flight: int = 8
    send_timeout: float = 10.0
    retries: int = 2
    credentials: tuple[str, str] | None = None
    tls: TlsOptions | None = None
    #: exactly-once: rows as transactional half messages committed by the driver (cometmq.spark.exactly_once)
    transactional: bool = False
    commit_topic: str = DEFAULT_COMMIT_TOPIC
    #: transactionTimeoutMs: a transactional write must commit within this long after its first half was sent
    transaction_timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS


# -- parsing --------------------------------------------------------------------------------------------------
def _normalize(options: Mapping[str, str], known: tuple[str, ...], what: str) -> dict[str, str]:
    """{canonical name: value}; an unknown option raises, naming it and the known ones."""
    canon = {k.lower(): k for k in known}
    out: dict[str, str] = {}
    for key, value in options.items():
        low = key.lower()
        if low in _SPARK_OWN:
            continue
        name = canon.get(low)
        if name is None:
            raise OptionError(f"unknown cometmq {what} option {key!r} (known: {', '.join(known)})")
        if value is None:
            continue
        out[name] = str(value)
    return out


def _int(opts: Mapping[str, str], name: str, *, minimum: int, maximum: int | None = None) -> int | None:
    raw = opts.get(name)
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise OptionError(f"option {name}={raw!r} is not an integer") from None
    if value < minimum:
        raise OptionError(f"option {name}={raw!r} must be at least {minimum}")
    if maximum is not None and value > maximum:
        raise OptionError(f"option {name}={raw!r} must be at most {maximum}")
    return value


def _bool(opts: Mapping[str, str], name: str, default: bool) -> bool:
    raw = opts.get(name)
    if raw is None:
        return default
    v = raw.strip().lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise OptionError(f"option {name}={raw!r} is not true or false")


def _namesrv(opts: Mapping[str, str]) -> str:
    raw = opts.get("namesrv")
    if not raw or not raw.strip():
        raise OptionError("option namesrv is required (the nameserver address, 'host:port;host:port')")
    try:
        return ";".join(parse_namesrv(raw))
    except InvalidArgumentError as exc:
        raise OptionError(f"option namesrv={raw!r}: {exc}") from None


def _credentials(opts: Mapping[str, str]) -> tuple[str, str] | None:
    """Options accessKey and secretKey: both or neither."""
    ak, sk = (opts.get("accessKey") or "").strip(), (opts.get("secretKey") or "").strip()
    if bool(ak) != bool(sk):
        raise OptionError("options accessKey and secretKey go together (an ACL account; docs/security.md)")
    return (ak, sk) if ak else None


def _tls(opts: Mapping[str, str]) -> TlsOptions | None:
    """Option tls and the tlsClient* options that go with it; the files must be there and load (on the driver)."""
    given = [n for n in _TLS_OPTIONS[1:] if n in opts]
    if not _bool(opts, "tls", False):
        if given:
            raise OptionError(f"option {given[0]} only applies with tls=true")
        return None
    paths: dict[str, str] = {}
    for name in ("tlsClientTrustCertPath", "tlsClientCertPath", "tlsClientKeyPath"):
        raw = opts.get(name)
        if raw is None:
            continue
        path = raw.strip()
        if not path:
            raise OptionError(f"option {name} is empty (the path of a PEM file)")
        if not os.path.isfile(path):
            raise OptionError(f"option {name}={raw!r}: no such file on the driver (the path must exist on the "
                              "driver and on every executor)")
        paths[name] = path
    cert, key = paths.get("tlsClientCertPath"), paths.get("tlsClientKeyPath")
    if (cert is None) != (key is None):
        raise OptionError("options tlsClientCertPath and tlsClientKeyPath go together (a client certificate and "
                          "its private key; the same path twice when one file holds both)")
    password = opts.get("tlsClientKeyPassword")
    if password is not None and key is None:
        raise OptionError("option tlsClientKeyPassword only applies with tlsClientKeyPath (an encrypted key)")
    auth_server = _bool(opts, "tlsClientAuthServer", True)
    trust = paths.get("tlsClientTrustCertPath")
    if trust is not None and not auth_server:
        raise OptionError("options tlsClientTrustCertPath and tlsClientAuthServer=false contradict each other (the "
                          "CA is only used to verify the broker's certificate)")
    tls = TlsOptions(trust_cert_path=trust, auth_server=auth_server, cert_path=cert, key_path=key,
                     key_password=password or None)
    tls.context()  # the files load now, or the query fails before any task runs
    return tls


def _topic(name: str, topic: str) -> str:
    try:
        return check_topic(topic)
    except InvalidArgumentError as exc:
        raise OptionError(f"option {name}: {exc}") from None


def _json(name: str, raw: str, what: str = "neither earliest, latest nor") -> object:
    try:
        return json.loads(raw)
    except ValueError as exc:  # JSONDecodeError, or a number of more digits than int() takes
        raise OptionError(f"option {name} is {what} valid JSON: {exc}") from None


def _per_queue(name: str, data: object, what: str, allowed_json: frozenset[int]) -> dict[str, dict[str, int]]:
    """``{topic: {"brokerName:queueId": value}}`` checked: the values are ``what`` (offsets or timestamps),
    integers, and a negative one only -2 (earliest) or -1 (latest), and only where ``allowed_json`` has it."""
    if not isinstance(data, dict) or not data:
        raise OptionError(f"option {name} must be JSON " + '{"topic": {"brokerName:queueId": ' + what + "}}")
    out: dict[str, dict[str, int]] = {}
    for topic, queues in data.items():
        _topic(name, topic)
        if not isinstance(queues, dict):
            raise OptionError(f"option {name}: the {what}s of {topic} must be an object "
                              '{"brokerName:queueId": ' + what + "}")
        per: dict[str, int] = {}
        for key, value in queues.items():
            try:
                broker, qid = split_queue_key(key)
            except OptionError as exc:
                raise OptionError(f"option {name}: {exc}") from None
            if isinstance(value, bool) or not isinstance(value, int):
                raise OptionError(f"option {name}: {what} of {topic} {key} is not an integer: {value!r}")
            if value < 0 and value not in allowed_json:
                names = {EARLIEST: "-2 (earliest)", LATEST: "-1 (latest)"}
                raise OptionError(f"option {name}: {what} {names.get(value, value)} of {topic} {key} "
                                  "is not allowed here")
            per[queue_key(broker, qid)] = value
        out[topic] = per
    return out


def _bound(opts: Mapping[str, str], offsets_name: str, by_ts_name: str, ts_name: str, *, default: str,
           allowed: frozenset[str], allowed_json: frozenset[int], streaming: bool) -> Bound:
    """One end of the read from whichever of its three options is given (more than one is a contradiction:
    Spark's Kafka source silently prefers the timestamp ones; this source refuses to guess)."""
    given = [n for n in (offsets_name, by_ts_name, ts_name) if n in opts]
    if len(given) > 1:
        raise OptionError(f"options {' and '.join(given)} contradict each other: give one")
    ts = opts.get(ts_name)
    if ts is not None:
        try:
            millis = int(ts.strip())
        except ValueError:
            raise OptionError(f"option {ts_name}={ts!r} is not epoch milliseconds") from None
        if millis < 0:
            raise OptionError(f"option {ts_name}={ts!r} is negative")
        return Bound("timestamp", timestamp=millis, option=ts_name)
    by_ts = opts.get(by_ts_name)
    if by_ts is not None:
        stamps = _per_queue(by_ts_name, _json(by_ts_name, by_ts, "not"), "timestamp", allowed_json)
        return Bound("timestamps", offsets=stamps, option=by_ts_name)
    raw = opts.get(offsets_name)
    if raw is None:
        return Bound(default, option=offsets_name)  # type: ignore[arg-type]
    word = raw.strip().lower()
    if word in ("earliest", "latest"):
        if word not in allowed:
            mode = "a streaming" if streaming else "a batch"
            raise OptionError(f"option {offsets_name}={word} makes no sense for {mode} read")
        return Bound(word, option=offsets_name)  # type: ignore[arg-type]
    data = _json(offsets_name, raw)
    if not isinstance(data, dict) or not data:
        raise OptionError(f"option {offsets_name} must be earliest, latest or JSON "
                          '{"topic": {"brokerName:queueId": offset}}')
    return Bound("offsets", offsets=_per_queue(offsets_name, data, "offset", allowed_json), option=offsets_name)


_DURATION = re.compile(r"(\d+)\s*(us|ms|s|sec|m|min|h|d)?")
_DURATION_MS = {"us": 0.001, "ms": 1, None: 1, "s": 1000, "sec": 1000, "m": 60_000, "min": 60_000,
                "h": 3_600_000, "d": 86_400_000}


def _duration(opts: Mapping[str, str], name: str) -> float | None:
    """A duration as Spark writes them (``500ms``, ``30s``, ``15m``, ``1h``; a bare number is milliseconds),
    in seconds."""
    raw = opts.get(name)
    if raw is None:
        return None
    m = _DURATION.fullmatch(raw.strip().lower())
    if m is None:
        raise OptionError(f"option {name}={raw!r} is not a duration (e.g. 500ms, 30s, 15m, 1h)")
    try:
        return int(m.group(1)) * _DURATION_MS[m.group(2)] / 1000
    except (OverflowError, ValueError):  # past a float, or more digits than int() takes
        raise OptionError(f"option {name}={raw!r} is too long a duration") from None


def _assign(raw: str) -> dict[str, tuple[int | str, ...]]:
    data = _json("assign", raw)
    if not isinstance(data, dict) or not data:
        raise OptionError('option assign must be JSON {"topic": [queueId, ...]} '
                          '(a queue id, or "brokerName:queueId")')
    out: dict[str, tuple[int | str, ...]] = {}
    for topic, queues in data.items():
        _topic("assign", topic)
        if not isinstance(queues, list) or not queues:
            raise OptionError(f"option assign: {topic} needs a non-empty list of queue ids")
        sel: list[int | str] = []
        for q in queues:
            if isinstance(q, bool) or not isinstance(q, int | str):
                raise OptionError(f"option assign: {q!r} of {topic} is not a queue id")
            if isinstance(q, int):
                if q < 0:
                    raise OptionError(f"option assign: queue id {q} of {topic} is negative")
                sel.append(q)
            else:
                try:
                    broker, qid = split_queue_key(q)
                except OptionError as exc:
                    raise OptionError(f"option assign: {exc}") from None
                sel.append(queue_key(broker, qid))
        out[topic] = tuple(sel)
    return out


def parse_read(options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    """The read options, checked; ``streaming`` for ``readStream``."""
    opts = _normalize(options, _READ_OPTIONS, "read")
    namesrv = _namesrv(opts)
    given = [n for n in ("subscribe", "subscribePattern", "assign") if opts.get(n, "").strip()]
    if len(given) != 1:
        if not given:
            raise OptionError("say what to read: one of the options subscribe, subscribePattern or assign")
        raise OptionError(f"options {' and '.join(given)} contradict each other: give exactly one")
    subscribe: tuple[str, ...] = ()
    pattern = None
    assign = None
    if given[0] == "subscribe":
        subscribe = tuple(dict.fromkeys(_topic("subscribe", t.strip())
                                        for t in opts["subscribe"].split(",") if t.strip()))
    elif given[0] == "subscribePattern":
        pattern = opts["subscribePattern"]
        try:
            re.compile(pattern)
        except re.error as exc:
            raise OptionError(f"option subscribePattern={pattern!r} is not a regular expression: {exc}") from None
    else:
        assign = _assign(opts["assign"])

    if streaming:
        for name in ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"):
            if name in opts:
                raise OptionError(f"option {name} is for batch reads; a stream has no end")
        starting = _bound(opts, "startingOffsets", "startingOffsetsByTimestamp", "startingTimestamp",
                          default="latest", allowed=frozenset({"earliest", "latest"}),
                          allowed_json=frozenset({EARLIEST, LATEST}), streaming=True)
        ending = Bound("latest")
    else:
        for name in ("maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay", "commitToGroup"):
            if name in opts:
                raise OptionError(f"option {name} is for streaming reads (readStream)")
        starting = _bound(opts, "startingOffsets", "startingOffsetsByTimestamp", "startingTimestamp",
                          default="earliest", allowed=frozenset({"earliest"}), allowed_json=frozenset({EARLIEST}),
                          streaming=False)
        ending = _bound(opts, "endingOffsets", "endingOffsetsByTimestamp", "endingTimestamp", default="latest",
                        allowed=frozenset({"latest"}), allowed_json=frozenset({LATEST}), streaming=False)
    for bound in (starting, ending):
        if bound.kind in ("offsets", "timestamps"):
            stray = [t for t in bound.offsets if not _selects(t, subscribe, pattern, assign)]
            if stray:
                raise OptionError(f"option {bound.option} names topics that are not read: "
                                  f"{', '.join(sorted(stray))}")
    raw_strategy = opts.get("startingOffsetsByTimestampStrategy")
    strategy = None
    if raw_strategy is not None:
        strategy = raw_strategy.strip().lower()
        if strategy not in ("error", "latest"):
            raise OptionError(f"option startingOffsetsByTimestampStrategy={raw_strategy!r} must be error or latest")
        if starting.kind not in ("timestamp", "timestamps"):
            raise OptionError("option startingOffsetsByTimestampStrategy only applies with startingTimestamp or "
                              "startingOffsetsByTimestamp")
    min_per_trigger = _int(opts, "minOffsetsPerTrigger", minimum=1)
    delay = _duration(opts, "maxTriggerDelay")
    if delay is not None and min_per_trigger is None:
        raise OptionError("option maxTriggerDelay only applies with minOffsetsPerTrigger")
    include = _bool(opts, "includeProperties", True)
    if "includeHeaders" in opts:
        headers = _bool(opts, "includeHeaders", True)
        if "includeProperties" in opts and headers != include:
            raise OptionError("options includeHeaders and includeProperties contradict each other "
                              "(includeHeaders is another name for includeProperties)")
        include = headers

    expression_type = opts.get("expressionType", "TAG").strip().upper()
    if expression_type not in ("TAG", "SQL92"):
        raise OptionError(f"option expressionType={opts['expressionType']!r} must be TAG or SQL92")
    expression = opts.get("subExpression", "*").strip() or "*"
    if expression_type == "SQL92" and expression == "*":
        raise OptionError("option expressionType=SQL92 needs a subExpression (a SQL92 condition on properties)")

    group = opts.get("consumerGroup", "cometmq-spark").strip()
    commit_to = opts.get("commitToGroup")
    for name, value in (("consumerGroup", group), ("commitToGroup", commit_to)):
        if value is not None:
            try:
                check_group(value.strip())
            except InvalidArgumentError as exc:
                raise OptionError(f"option {name}: {exc}") from None
    timeout_ms = _int(opts, "requestTimeoutMs", minimum=100, maximum=MAX_TIMEOUT_MS)
    return ReadOptions(
        namesrv=namesrv, subscribe=subscribe, pattern=pattern, assign=assign, starting=starting, ending=ending,
        timestamp_strategy="latest" if strategy == "latest" else "error",
        max_offsets_per_trigger=_int(opts, "maxOffsetsPerTrigger", minimum=1),
        min_offsets_per_trigger=min_per_trigger,
        max_trigger_delay=15 * 60.0 if delay is None else delay,
        # (Spark's Kafka source takes an Int: a larger one also overflowed the planner's float arithmetic)
        min_partitions=_int(opts, "minPartitions", minimum=1, maximum=2**31 - 1),
        max_records_per_partition=_int(opts, "maxRecordsPerPartition", minimum=1, maximum=2**63 - 1),
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        expression=expression, expression_type=expression_type,
        include_properties=include,
        commit_to_group=commit_to.strip() if commit_to else None,
        group=commit_to.strip() if commit_to and "consumerGroup" not in opts else group,
        timeout=(timeout_ms or 10_000) / 1000, credentials=_credentials(opts), tls=_tls(opts))


def _selects(topic: str, subscribe: tuple[str, ...], pattern: str | None,
             assign: Mapping[str, tuple[int | str, ...]] | None) -> bool:
    if pattern is not None:
        return re.fullmatch(pattern, topic) is not None
    if assign is not None:
        return topic in assign
    return topic in subscribe


def parse_write(options: Mapping[str, str]) -> WriteOptions:
    """The write options, checked."""
    opts = _normalize(options, _WRITE_OPTIONS, "write")
    namesrv = _namesrv(opts)
    topic = opts.get("topic")
    if topic is not None:
        topic = _topic("topic", topic.strip())
    group = opts.get("producerGroup", "cometmq-spark-writer").strip()
    try:
        check_group(group)
    except InvalidArgumentError as exc:
        raise OptionError(f"option producerGroup: {exc}") from None
    timeout_ms = (_int(opts, "sendTimeoutMs", minimum=100, maximum=MAX_TIMEOUT_MS)
                  or _int(opts, "requestTimeoutMs", minimum=100, maximum=MAX_TIMEOUT_MS))
    retries = _int(opts, "retries", minimum=0)
    transactional = _bool(opts, "transactional", False)
    commit_topic = _topic("commitTopic", opts.get("commitTopic", DEFAULT_COMMIT_TOPIC).strip())
    for name in ("commitTopic", "transactionTimeoutMs"):
        if name in opts and not transactional:
            raise OptionError(f"option {name} only means something with transactional=true")
    tx_timeout = _int(opts, "transactionTimeoutMs", minimum=MIN_TRANSACTION_TIMEOUT_MS, maximum=MAX_TIMEOUT_MS)
    if transactional and "producerGroup" in opts:
        raise OptionError("option producerGroup contradicts transactional=true: a transactional write's producer "
                          "group is derived from the query id (cometmq-spark-eos-<id>)")
    return WriteOptions(
        namesrv=namesrv, topic=topic, producer_group=group,
        batch_size=_int(opts, "batchSize", minimum=1) or 256,
        max_in_flight=_int(opts, "maxInFlight", minimum=1) or 8,
        send_timeout=(timeout_ms or 10_000) / 1000,
        retries=2 if retries is None else retries, credentials=_credentials(opts), tls=_tls(opts),
        transactional=transactional, commit_topic=commit_topic,
        transaction_timeout_ms=DEFAULT_TRANSACTION_TIMEOUT_MS if tx_timeout is None else tx_timeout)
