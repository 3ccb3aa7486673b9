"""PULL_MESSAGE (11) with long polling."""

from __future__ import annotations

import logging
from typing import cast

from cometmq.broker.clients import ConsumerManager
from cometmq.broker.config import BrokerConfig
from cometmq.broker.filters import property_filter_for, record_filter_for, tag_filter_for
from cometmq.broker.groups import SubscriptionGroupManager
from cometmq.broker.long_polling import HeldPull, PullRequestHoldService
from cometmq.broker.offsets import MAX_COMMIT_OFFSET, ConsumerOffsetManager, check_commit_offset
from cometmq.broker.stats import BrokerStats
from cometmq.broker.topics import TopicConfigManager, check_read_queue
from cometmq.net.connection import ConnectionClosedError, RemotingConnection, eager_start
from cometmq.protocol.codes import RemotingError, ResponseCode
from cometmq.protocol.headers import PullMessageRequestHeader
from cometmq.protocol.remoting import ONEWAY_FLAG, RemotingCommand, make_response
from cometmq.protocol.route import perm_readable
from cometmq.store.mapped_file import FileRegion
from cometmq.store.message_store import MessageStore
from cometmq.store.status import GetResult, GetStatus

log = logging.getLogger(__name__)

# PullSysFlag bits
FLAG_COMMIT_OFFSET = 0x1
FLAG_SUSPEND = 0x2
FLAG_SUBSCRIPTION = 0x4
FLAG_CLASS_FILTER = 0x8


def _code_for(result: GetResult, request_offset: int) -> int:
    status = result.status
    if status is GetStatus.FOUND:
        return ResponseCode.SUCCESS
    if status in (GetStatus.MESSAGE_WAS_REMOVING, GetStatus.NO_MATCHED_MESSAGE):
        return ResponseCode.PULL_RETRY_IMMEDIATELY
    if status in (GetStatus.NO_MATCHED_LOGIC_QUEUE, GetStatus.NO_MESSAGE_IN_QUEUE):
        return ResponseCode.PULL_OFFSET_MOVED if request_offset != 0 else ResponseCode.PULL_NOT_FOUND
    if status in (GetStatus.OFFSET_OVERFLOW_BADLY, GetStatus.OFFSET_TOO_SMALL):
        return ResponseCode.PULL_OFFSET_MOVED
    return ResponseCode.PULL_NOT_FOUND  # OFFSET_FOUND_NULL, OFFSET_OVERFLOW_ONE


class PullProcessor:
    """Answers pulls; a pull that finds nothing waits in its hold service (long polling) until an arrival."""

    def __init__(self, config: BrokerConfig, store: MessageStore, topics: TopicConfigManager,
                 groups: SubscriptionGroupManager, consumers: ConsumerManager,
                 offsets: ConsumerOffsetManager, stats: BrokerStats | None = None) -> None:
        self.config = config
        #: None: metrics are off, nothing is counted
        self.stats = stats
        self.store = store
        self.topics = topics
        self.groups = groups
        self.consumers = consumers
        self.offsets = offsets
        self.hold = PullRequestHoldService(store.max_offset, self.replay,
                                           check_interval_s=config.hold_check_interval_ms / 1000)

    @eager_start
    async def pull(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand | None:
        response, region = self.process(conn, cmd, allow_suspend=True)
        if response is None or region is None or cmd.flag & ONEWAY_FLAG:
            return response
        try:  # sent here, with where its body lies in the commit log: the connection may send it from the file
            conn.send_response(response, file_region=region)
        except ConnectionClosedError:
            pass  # the peer is gone
        return None

    def replay(self, conn: RemotingConnection, cmd: RemotingCommand,
               header: PullMessageRequestHeader | None = None) -> None:
        """Run a held pull once more, suspending no longer, and send its answer. Synchronous (a read of the
        store and a write), so the hold service runs it at once when an arrival wakes the pull, rather than a
        loop turn later as a task."""
        region = None
        try:
            response, region = self.process(conn, cmd, allow_suspend=False, header=header)
        except RemotingError as exc:
            response = make_response(cmd, exc.code, exc.remark)
        except Exception as exc:  # an answer must go back, whatever happened
            log.exception("replaying a held pull failed")
            response = make_response(cmd, ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")
        if response is not None:
            conn.send_response(response, file_region=region)

    def process(self, conn: RemotingConnection, cmd: RemotingCommand, *, allow_suspend: bool,
                header: PullMessageRequestHeader | None = None) -> tuple[RemotingCommand | None, FileRegion | None]:
        """Answer a pull (``header``: ``cmd``'s, parsed already): (the answer, where its body lies in the commit
        log when it is one piece of it, else None). The answer is None when the pull was held."""
        if header is not None:
            h = header
        else:
            h = PullMessageRequestHeader.from_ext(cmd.ext_fields)  # a bad header: answered at the dispatch
        config = self.config
        if not perm_readable(config.broker_permission):
            raise RemotingError(ResponseCode.NO_PERMISSION, f"the broker {config.broker_name} is not readable")
        group_cfg = self.groups.require(h.consumer_group)
        if not group_cfg.consumeEnable:
            raise RemotingError(ResponseCode.NO_PERMISSION, f"group {h.consumer_group} may not consume")
        topic_cfg = self.topics.existing(h.topic)
        if not perm_readable(topic_cfg.perm):
            raise RemotingError(ResponseCode.NO_PERMISSION, f"the topic {h.topic} is not readable")
        check_read_queue(topic_cfg, h.queue_id)
        if h.commit_offset > MAX_COMMIT_OFFSET and h.sys_flag & FLAG_COMMIT_OFFSET:
            check_commit_offset(h.commit_offset)  # (a negative one is not committed: not an error)
        if h.sys_flag & FLAG_SUBSCRIPTION:
            expression, expression_type = h.subscription, h.expression_type
        else:
            sub = self.consumers.subscription(h.consumer_group, h.topic)
            if sub is None:
                raise RemotingError(ResponseCode.SUBSCRIPTION_NOT_EXIST,
                                    f"group {h.consumer_group} has no subscription to {h.topic}")
            expression, expression_type = sub.sub_string, sub.expression_type
        prop_filter = property_filter_for(expression_type, expression, config.enable_property_filter)
        tag_filter = None if prop_filter is not None or (expression_type or "TAG").upper() != "TAG" \
            else tag_filter_for(expression)
        record_filter = record_filter_for(prop_filter) if prop_filter is not None else None

        # coalesce: the answer joins the records anyway, so a run of them back to back comes as one view
        result = self.store.get_messages(h.topic, h.queue_id, h.queue_offset, h.max_msg_nums, tag_filter,
                                         record_filter, coalesce=True)
        code = _code_for(result, h.queue_offset)
        # (beyond its connection's cap of held pulls, a pull is answered now, as one that asked for no suspending)
        if code == ResponseCode.PULL_NOT_FOUND and allow_suspend and h.sys_flag & FLAG_SUSPEND \
                and self.hold.can_hold(conn):
            long_polling = config.long_polling_enable
            timeout_ms = h.suspend_timeout_millis if long_polling else config.short_polling_time_ms
            self.hold.suspend(HeldPull(conn, cmd, h.topic, h.queue_id, h.queue_offset, tag_filter,
                                         wake_on_arrival=long_polling, property_filter=prop_filter, header=h),
                                max(timeout_ms, 0) / 1000)
            self._commit(h, allow_suspend)
            return None, None
        self._commit(h, allow_suspend)
        next_offset = result.next_begin_offset
        if code == ResponseCode.PULL_OFFSET_MOVED:
            log.info("pull of %s-%d by %s at %d moved to %d (%s)", h.topic, h.queue_id, h.consumer_group,
                     h.queue_offset, next_offset, result.status.value)
        ext = {"suggestWhichBrokerId": "0", "nextBeginOffset": str(next_offset),
               "minOffset": str(result.min_offset), "maxOffset": str(result.max_offset)}
        if code == ResponseCode.SUCCESS:
            if self.stats is not None:
                self.stats.got(h.topic, h.consumer_group, h.queue_id, len(result.queue_offsets),
                               result.buffer_total_size, next_offset)
            buffers = result.buffers
            # One view (records back to back: the common answer) goes to the socket as it is, no copy: the body
            # is only ever written out. The commit log is append-only, and a segment that retention closes while
            # the write is pending stays mapped until the transport lets go of the view (MappedFile._close).
            body = cast(bytes, buffers[0]) if len(buffers) == 1 else b"".join(buffers)
            return make_response(cmd, code, None, ext, body), result.file_region  # set for one view only
        return make_response(cmd, code, result.status.value, ext), None

    def _commit(self, h: PullMessageRequestHeader, allow_suspend: bool) -> None:
        # Only the first run of a request commits; a replay of a held pull must not commit again.
        if allow_suspend and h.sys_flag & FLAG_COMMIT_OFFSET and h.commit_offset >= 0:
            self.offsets.commit(h.consumer_group, h.topic, h.queue_id, h.commit_offset)
