"""The limits RocketMQ 5's proxy puts on what clients send (its ProxyConfig keys and the checks of GrpcValidator
and the gRPC activities), with the same defaults and status codes. The configurable ones are keys of
``ProxyConfig``; a key of 0 or less turns its limit off, as in RocketMQ. Every check runs before anything is sent
to a broker: a refused request changes nothing."""

from __future__ import annotations

from cometmq.grpc.config import ProxyConfig
from cometmq.grpc.convert import duration_ms, message_type_of, timestamp_ms
from cometmq.grpc.status import GrpcError
from cometmq.grpc.v2 import definition_pb2 as pb
from cometmq.grpc.v2 import service_pb2 as spb
from cometmq.protocol.names import (
    SYSTEM_GROUP_PREFIX,
    TOPIC_NAME_MAX,
    group_name_problem,
    is_system_topic,
    name_problem,
)


def check_topic(topic: pb.Resource) -> None:
    """ILLEGAL_TOPIC for a topic name RocketMQ's proxy refuses (GrpcValidator.validateTopic)."""
    name = topic.name
    problem = name_problem(name, TOPIC_NAME_MAX)
    if problem is not None:
        raise GrpcError(pb.Code.ILLEGAL_TOPIC, f"topic name {name!r} {problem}")
    if is_system_topic(name):
        raise GrpcError(pb.Code.ILLEGAL_TOPIC, f"topic {name} is a system topic")


def check_group(group: pb.Resource) -> None:
    """ILLEGAL_CONSUMER_GROUP for a group name RocketMQ's proxy refuses (GrpcValidator.validateConsumerGroup)."""
    name = group.name
    problem = group_name_problem(name)
    if problem is not None:
        raise GrpcError(pb.Code.ILLEGAL_CONSUMER_GROUP, f"consumer group name {name!r} {problem}")
    if name.startswith(SYSTEM_GROUP_PREFIX):
        raise GrpcError(pb.Code.ILLEGAL_CONSUMER_GROUP, f"consumer group {name} is a system group")


def control_character(text: str) -> str | None:
    """The first control character of ``text`` (Java's ``Character.isISOControl``: U+0000..U+001F and
    U+007F..U+009F, what RocketMQ's proxy refuses), or None."""
    for c in text:
        if c < " " or "\x7f" <= c <= "\x9f":
            return c
    return None


def check_message(msg: pb.Message, config: ProxyConfig, now_ms: int) -> None:
    """SendMessage's checks of one message that ``convert.send_properties`` does not make (RocketMQ's
    SendMessageActivity): GrpcError with RocketMQ's code, naming the limit, for the first one it breaks."""
    sp = msg.system_properties
    if config.empty_body_check and not msg.body:
        raise GrpcError(pb.Code.MESSAGE_BODY_EMPTY, "the message body is empty (empty_body_check)")
    _check_user_properties(msg, config)
    if sp.HasField("tag") and (c := control_character(sp.tag)) is not None:
        raise GrpcError(pb.Code.ILLEGAL_MESSAGE_TAG, f"tag {sp.tag!r} has the control character {c!r}")
    for key in sp.keys:
        if (c := control_character(key)) is not None:
            raise GrpcError(pb.Code.ILLEGAL_MESSAGE_KEY, f"message key {key!r} has the control character {c!r}")
    if sp.HasField("message_group") and sp.message_group:
        _check_message_group(sp.message_group, config.max_message_group_size)
    if sp.HasField("delivery_timestamp") and config.max_delay_ms > 0:
        ahead = timestamp_ms(sp.delivery_timestamp) - now_ms
        if ahead > config.max_delay_ms:
            raise GrpcError(pb.Code.ILLEGAL_DELIVERY_TIME,
                            f"the delivery timestamp is {ahead} ms ahead: more than max_delay_ms "
                            f"({config.max_delay_ms} ms)")
    if (message_type_of(msg) == pb.TRANSACTION and sp.HasField("orphaned_transaction_recovery_duration")
            and config.max_transaction_recovery_s > 0):
        seconds = int(sp.orphaned_transaction_recovery_duration.seconds)
        if seconds > config.max_transaction_recovery_s:
            raise GrpcError(pb.Code.BAD_REQUEST,
                            f"orphaned transaction recovery duration {seconds} s exceeds max_transaction_recovery_s "
                            f"({config.max_transaction_recovery_s} s)")


def _check_user_properties(msg: pb.Message, config: ProxyConfig) -> None:
    """Count, control characters, and the total size: UTF-8 bytes of every user property's key and value, the
    tag and the keys (what RocketMQ's maxUserPropertySize counts)."""
    count = len(msg.user_properties)
    if 0 < config.max_user_properties < count:
        raise GrpcError(pb.Code.MESSAGE_PROPERTIES_TOO_LARGE,
                        f"{count} user properties: more than max_user_properties ({config.max_user_properties})")
    size = 0
    for key, value in msg.user_properties.items():
        for what, text in (("key", key), ("value", value)):
            if (c := control_character(text)) is not None:
                raise GrpcError(pb.Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
                                f"the {what} of user property {key!r} has the control character {c!r}")
        size += len(key.encode()) + len(value.encode())
    sp = msg.system_properties
    size += len(sp.tag.encode()) + sum(len(k.encode()) for k in sp.keys)
    if 0 < config.max_user_property_size < size:
        raise GrpcError(pb.Code.MESSAGE_PROPERTIES_TOO_LARGE,
                        f"user properties, tag and keys take {size} bytes: more than max_user_property_size "
                        f"({config.max_user_property_size})")


def _check_message_group(group: str, max_size: int) -> None:
    if not group.strip():
        raise GrpcError(pb.Code.ILLEGAL_MESSAGE_GROUP, "the message group is only whitespace")
    size = len(group.encode())
    if max_size > 0 and size >= max_size:  # RocketMQ refuses a group of max_size bytes too
        raise GrpcError(pb.Code.ILLEGAL_MESSAGE_GROUP,
                        f"the message group has {size} bytes: it must be shorter than max_message_group_size "
                        f"({max_size})")
    if (c := control_character(group)) is not None:
        raise GrpcError(pb.Code.ILLEGAL_MESSAGE_GROUP, f"the message group has the control character {c!r}")


def check_invisible(duration: int, config: ProxyConfig) -> None:
    """ILLEGAL_INVISIBLE_TIME for an invisible duration (ms) that is negative or longer than ``max_invisible_ms``
    (RocketMQ's maxInvisibleTimeMills)."""
    if duration < 0:
        raise GrpcError(pb.Code.ILLEGAL_INVISIBLE_TIME, f"invisible duration {duration} ms is negative")
    if 0 < config.max_invisible_ms < duration:
        raise GrpcError(pb.Code.ILLEGAL_INVISIBLE_TIME,
                        f"invisible duration {duration} ms is longer than max_invisible_ms "
                        f"({config.max_invisible_ms} ms)")


def receive_invisible(request: spb.ReceiveMessageRequest, config: ProxyConfig) -> int:
    """The invisible time (ms) of a ReceiveMessage. ``default_invisible_ms`` for a receive without one (push
    consumers send none) or with ``auto_renew`` when renewal is on (RocketMQ's proxy then ignores the request's and
    uses its defaultInvisibleTimeMills, renewing it while the client holds the message: grpc/renewal.py); else the
    request's, at least ``min_receive_invisible_ms`` (RocketMQ's minInvisibleTimeMillsForRecv, 10 s) and at most
    ``max_invisible_ms``."""
    if not request.HasField("invisible_duration") or (request.auto_renew and config.auto_renew):
        return config.default_invisible_ms
    invisible = duration_ms(request.invisible_duration)
    minimum = max(config.min_receive_invisible_ms, 1)  # 0 hides nothing: never a receive's invisible time
    if invisible < minimum:
        raise GrpcError(pb.Code.ILLEGAL_INVISIBLE_TIME,
                        f"invisible duration {invisible} ms is shorter than min_receive_invisible_ms "
                        f"({config.min_receive_invisible_ms} ms)")
    check_invisible(invisible, config)
    return invisible
