"""The records of the transaction design, built from and read back as plain values (no I/O).

RocketMQ's design, kept here:

- A *half* message is the producer's message stored under ``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0, with its real
  topic and queue in ``REAL_TOPIC`` / ``REAL_QID`` and the transaction bits of its sys flag cleared, so the
  dispatcher gives it a consume-queue unit in the half topic (never in the real topic).
- An *op* record under ``RMQ_SYS_TRANS_OP_HALF_TOPIC`` (tag ``d``) says "done": its body is the half queue
  offsets it resolves, comma-separated.
- Each check-back re-appends the half (a *copy*) with ``TRANSACTION_CHECK_TIMES`` + 1, so the count survives a
  restart. Copies name their first half in ``TRAN_PREPARED_QUEUE_OFFSET`` (RocketMQ uses that property on its
  renewed halves for the same purpose); a transaction is identified by that *origin* offset, whichever copy a
  producer's END_TRANSACTION names. That is what keeps a commit from being delivered twice.
- The committed message goes back to the real topic and queue with the COMMIT sys flag; it keeps the
  producer's properties (UNIQ_KEY, KEYS, TAGS, user properties) minus the broker's bookkeeping ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from cometmq.protocol.message import TRANSACTION_MASK, MessageRecord, encode_record, pack_host
from cometmq.protocol.properties import (
    PGROUP,
    REAL_QID,
    REAL_TOPIC,
    TAGS,
    TRAN_MSG,
    RawProperties,
    encode_properties,
)
from cometmq.store.message import TRANSACTION_COMMIT_TYPE, MessageInner

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
CHECK_MAX_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
REMOVE_TAG = "d"
#: Property keys (RocketMQ MessageConst).
TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
TRAN_PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"
#: Properties that only the broker's bookkeeping needs; the committed message goes out without them.
_BOOKKEEPING = (REAL_TOPIC, REAL_QID, TRAN_MSG, TRAN_PREPARED_QUEUE_OFFSET)
#: properties a producer's half must not bring: the broker sets them (or drops them)
_SET_BY_BROKER = (REAL_TOPIC, REAL_QID, TRANSACTION_CHECK_TIMES, TRAN_PREPARED_QUEUE_OFFSET)


def to_half(msg: MessageInner, producer_group: str) -> None:
    """Turn a producer's transactional message into its half, in place."""
    props_in = msg.properties
    raw = msg.properties_raw
    decoded = props_in.decoded() if type(props_in) is RawProperties else None
    if (decoded is not None and raw is not None and decoded.get(TRAN_MSG) == "true" and decoded.get(PGROUP)
            and not any(k in decoded for k in _SET_BY_BROKER)):
        # A half batch's items as the SDK sends them: the two pairs appended to the encoded properties rather
        # than all of them encoded again (a few µs a half); the same properties as the dict path below makes.
        topic, queue_id = msg.topic, str(msg.queue_id)
        if raw and not raw.endswith(b"\x02"):
            raw += b"\x02"
        raw += f"{REAL_TOPIC}\x01{topic}\x02{REAL_QID}\x01{queue_id}\x02".encode()
        decoded[REAL_TOPIC], decoded[REAL_QID] = topic, queue_id
        msg.properties, msg.properties_raw, msg.encoded = decoded, raw, None
    else:
        props = msg.edit_properties()
        props[REAL_TOPIC] = msg.topic
        props[REAL_QID] = str(msg.queue_id)
        props[TRAN_MSG] = "true"
        if not props.get(PGROUP):
            props[PGROUP] = producer_group
        props.pop(TRANSACTION_CHECK_TIMES, None)
        props.pop(TRAN_PREPARED_QUEUE_OFFSET, None)
        msg.properties_raw = None
    msg.topic = HALF_TOPIC
    msg.queue_id = 0
    msg.sys_flag &= ~TRANSACTION_MASK
    msg.tags_code = None


def origin_of(properties: Mapping[str, str], queue_offset: int) -> int:
    """The half queue offset that identifies the transaction a half record belongs to."""
    raw = properties.get(TRAN_PREPARED_QUEUE_OFFSET)
    if raw:
        try:
            return int(raw)
        except ValueError:
            pass
    return queue_offset


def check_times_of(properties: Mapping[str, str]) -> int:
    try:
        return max(0, int(properties.get(TRANSACTION_CHECK_TIMES, "0")))
    except ValueError:
        return 0


def immunity_ms(properties: Mapping[str, str], timeout_ms: int) -> int:
    """How long after its store time a half is left alone: the producer's CHECK_IMMUNITY_TIME_IN_SECONDS when
    longer than ``transactionTimeOut``, else the timeout (RocketMQ's ``getImmunityTime``)."""
    try:
        wanted = int(properties.get(CHECK_IMMUNITY_TIME_IN_SECONDS, "0")) * 1000
    except ValueError:
        wanted = 0
    return max(wanted, timeout_ms)


def _inner(rec: MessageRecord, topic: str, queue_id: int, props: dict[str, str], sys_flag: int) -> MessageInner:
    return MessageInner(topic=topic, body=rec.body, queue_id=queue_id, properties=props, flag=rec.flag,
                        sys_flag=sys_flag, born_timestamp=rec.born_timestamp, born_host=pack_host(*rec.born_host),
                        reconsume_times=rec.reconsume_times)


def copy_for_check(rec: MessageRecord, origin: int, check_times: int) -> MessageInner:
    """The re-appended half of a check-back: same message, one more check counted, pointing at its origin."""
    props = dict(rec.properties)
    props[TRANSACTION_CHECK_TIMES] = str(check_times)
    props[TRAN_PREPARED_QUEUE_OFFSET] = str(origin)
    return _inner(rec, HALF_TOPIC, 0, props, rec.sys_flag)


def real_destination(rec: MessageRecord) -> tuple[str, int]:
    topic = rec.properties.get(REAL_TOPIC, "")
    try:
        queue_id = int(rec.properties.get(REAL_QID, "0"))
    except ValueError:
        queue_id = 0
    return topic, queue_id


def committed(rec: MessageRecord, half_commit_log_offset: int) -> MessageInner:
    """The message a commit delivers: back in its real topic and queue, with the COMMIT sys flag (its properties
    encoded here: a batched END sizes its appends by them)."""
    topic, queue_id = real_destination(rec)
    props = {k: v for k, v in rec.properties.items() if k not in _BOOKKEEPING}
    msg = _inner(rec, topic, queue_id, props, (rec.sys_flag & ~TRANSACTION_MASK) | TRANSACTION_COMMIT_TYPE)
    msg.properties_raw = encode_properties(props)
    msg.prepared_transaction_offset = half_commit_log_offset
    return msg


def discarded(rec: MessageRecord) -> MessageInner:
    """A half checked ``transactionCheckMax`` times, kept for inspection under TRANS_CHECK_MAX_TIME_TOPIC."""
    return _inner(rec, CHECK_MAX_TOPIC, 0, dict(rec.properties), rec.sys_flag & ~TRANSACTION_MASK)


def op_record(offsets: list[int], born_ms: int) -> MessageInner:
    body = ",".join(str(o) for o in sorted(set(offsets))).encode()
    return MessageInner(topic=OP_TOPIC, body=body, queue_id=0, properties={TAGS: REMOVE_TAG},
                        born_timestamp=born_ms)


def parse_op_body(body: bytes) -> list[int]:
    """The half queue offsets an op record resolves; malformed parts are skipped."""
    out: list[int] = []
    for part in body.decode("ascii", "replace").split(","):
        part = part.strip()
        if part.isdigit():
            out.append(int(part))
    return out


def check_request_body(rec: MessageRecord) -> bytes:
    """The message a CHECK_TRANSACTION_STATE carries: the half record as stored, shown with its real topic and
    queue (as RocketMQ's broker sends it), so the producer's checker sees the message it sent."""
    topic, queue_id = real_destination(rec)
    return encode_record(dataclasses.replace(rec, topic=topic, queue_id=queue_id))
