"""The broker's fast answer to the most common woken pull: a held PULL_MESSAGE whose queue just got the one record
it waits for.

An idle consumer's long poll is parked at the end of its queue; the append of the next message dispatches it and
wakes the pull (broker/long_polling.py), whose generic replay (``PullProcessor.process``) checks the request
again, reads the queue (``MessageStore.get_messages``: the consume-queue units, the run of records, a
``GetResult``), builds a ``RemotingCommand`` and encodes its JSON header: ~75 µs of Python on cold caches after the
idle wait, most of the broker's share of an idle consumer's latency. The arrival that wakes the pull already says
where the record lies (its ``DispatchRequest``), so when that record is the whole answer — the pull asks for the
queue offset the record got, the queue ends right after it, the pull has no filter — ``PullFastPath`` runs the
same checks, takes the record's bytes from the commit log (one view, its size and magic code checked as the
store's read checks them), writes the answer from a byte template, then counts it in the stats and tells the
observer (the generic path's effects, the write first).

Anything else returns False before any effect, and the generic replay answers as it always did: a request not
in JSON, a check that fails (its error answer is the generic path's), a tag or SQL92 filter, a queue holding
more than that record past the offset (several records to answer), a record not in one segment or big enough to
be sent from the file. tests/broker/test_pull_fast.py checks that both paths answer the same bytes.
"""

from __future__ import annotations

import struct

from cometmq.broker.filters import property_filter_for, tag_filter_for
from cometmq.broker.long_polling import HeldPull
from cometmq.broker.pull import FLAG_SUBSCRIPTION, PullProcessor
from cometmq.common.memo import remember
from cometmq.net.connection import SENDFILE_THRESHOLD
from cometmq.protocol.codes import ResponseCode
from cometmq.protocol.headers import PullMessageRequestHeader
from cometmq.protocol.record_layout import LAYOUT_V4, MAGIC_CODE
from cometmq.protocol.remoting import DEFAULT_VERSION, RESPONSE_FLAG, SerializeType
from cometmq.protocol.route import PERM_READ
from cometmq.store.message import DispatchRequest

_SUCCESS = int(ResponseCode.SUCCESS)
_JSON = SerializeType.JSON
_PREFIX = struct.Struct(">II")
_SIZE_MAGIC = LAYOUT_V4.struct_of("total_size", "magic_code").unpack_from
#: the answer ``PullProcessor.process`` builds for records found, as protocol/remoting.py encodes it: opaque,
#: next begin offset, min offset, max offset
_ANSWER = (b'{"code":' + str(_SUCCESS).encode() + b',"language":"PYTHON","version":' + str(DEFAULT_VERSION).encode()
           + b',"opaque":%d,"flag":' + str(RESPONSE_FLAG).encode() + b',"extFields":{"suggestWhichBrokerId":"0",'
           b'"nextBeginOffset":"%d","minOffset":"%d","maxOffset":"%d"},"serializeTypeCurrentRPC":"JSON"}')
#: (expression type, expression, SQL92 enabled) pairs known to make no filter (bounded)
_PLAIN_MAX = 1024


class PullFastPath:
    """Answers a held pull woken by the arrival of the one record it gets (see the module's text), for
    ``processor``; called by the hold service with the pull and the arrival."""

    def __init__(self, processor: PullProcessor) -> None:
        self._proc = processor
        self._plain: set[tuple[str | None, str | None, bool]] = set()

    def __call__(self, held: HeldPull, req: DispatchRequest) -> bool:
        h = held.header
        cmd = held.request
        if type(h) is not PullMessageRequestHeader or cmd.serialize_type is not _JSON:
            return False
        try:
            frame = self._frame(held, h, req)
        except Exception:  # (whatever went wrong, the generic replay meets it too, and answers it)
            return False
        if frame is None:
            return False
        # written, counted and observed, as the generic path does, in one call: the write first, as it is what the
        # consumer waits for; a write refused (the peer has gone) is left to the generic replay, which drops it too
        conn = held.conn
        opaque = cmd.opaque
        if not conn.send_frame(frame, _SUCCESS, opaque):
            return False
        stats = self._proc.stats
        if stats is not None:
            stats.got(h.topic, h.consumer_group, h.queue_id, 1, req.size, req.queue_offset + 1)
        if conn.observer is not None:
            conn.reply_observed(opaque, _SUCCESS)
        return True

    def _frame(self, held: HeldPull, h: PullMessageRequestHeader, req: DispatchRequest) -> bytes | None:
        """The answer's frame when the fast answer applies, else None (nothing done either way)."""
        offset = h.queue_offset
        if offset != req.queue_offset or req.sys_flag & 0x4:  # (a transaction half: in no consume queue)
            return None
        proc = self._proc
        config = proc.config
        if not config.broker_permission & PERM_READ:  # (perm_readable)
            return None
        group_cfg = proc.groups.find(h.consumer_group)
        if group_cfg is None or not group_cfg.consumeEnable:
            return None
        topic = h.topic
        topic_cfg = proc.topics.topics.get(topic)  # (TopicConfigManager.get)
        if topic_cfg is None or not topic_cfg.perm & PERM_READ or not 0 <= h.queue_id < topic_cfg.read_queue_nums:
            return None
        expression: str | None
        expression_type: str | None
        if not h.sys_flag & FLAG_SUBSCRIPTION:
            sub = proc.consumers.subscription(h.consumer_group, topic)
            if sub is None:
                return None
            expression, expression_type = sub.sub_string, sub.expression_type
        else:
            expression, expression_type = h.subscription, h.expression_type
        key = (expression_type, expression, config.enable_property_filter)
        if key not in self._plain and not self._no_filter(key):
            return None
        store = proc.store
        cq = store.queues.get((topic, h.queue_id))
        if cq is None:
            return None
        min_off, max_off = cq.bounds()
        size = req.size
        if max_off != offset + 1 or offset < min_off or size >= SENDFILE_THRESHOLD:
            return None
        view = store.commitlog.read(req.phy_offset, size)  # (None below the log's start, or past its end)
        if view is None or _SIZE_MAGIC(view, 0) != (size, MAGIC_CODE):
            return None
        header = _ANSWER % (held.request.opaque, max_off, min_off, max_off)
        return _PREFIX.pack(len(header) + 4 + size, len(header)) + header + view

    def _no_filter(self, key: tuple[str | None, str | None, bool]) -> bool:
        """Whether ``process`` makes no filter of this subscription (and raises nothing); remembered when so."""
        expression_type, expression, enabled = key
        try:
            if property_filter_for(expression_type, expression, enabled) is not None:
                return False
            if (expression_type or "TAG").upper() == "TAG" and tag_filter_for(expression) is not None:
                return False
        except Exception:
            return False
        remember(self._plain, key, _PLAIN_MAX)
        return True
