"""The remoting protocol's code tables: request codes, response codes, language codes.

Numbers are RocketMQ's (``RequestCode``, ``ResponseCode``, ``RemotingSysResponseCode``, ``LanguageCode``),
so that every client and tool that speaks the remoting protocol agrees with us, except the *cometmq extensions*
(section at the end of ``RequestCode``): requests RocketMQ has no code for, numbered 31000 + the code of the
RocketMQ request they extend, so that they fit the binary header's int16 and lie far from RocketMQ's own numbers
(its int16 codes end near 3000); a RocketMQ broker answers them REQUEST_CODE_NOT_SUPPORTED. docs/transactions.md
lists them with their wire shape. ``RemotingError`` is the one
exception that carries a response code: processors raise it and the transport turns it into a reply. A request
the peer got wrong (``RemoteProtocolError``) gets the code ``bad_request_code`` picks for its request code.
"""

from __future__ import annotations

from enum import IntEnum


class RequestCode(IntEnum):
    # -- broker: messages, offsets, clients ---------------------------------------------------------------
    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12
    QUERY_BROKER_OFFSET = 13
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    UPDATE_AND_CREATE_TOPIC_LIST = 18
    GET_ALL_TOPIC_CONFIG = 21
    GET_TOPIC_CONFIG_LIST = 22
    GET_TOPIC_NAME_LIST = 23
    UPDATE_BROKER_CONFIG = 25
    GET_BROKER_CONFIG = 26
    TRIGGER_DELETE_FILES = 27
    GET_BROKER_RUNTIME_INFO = 28
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    GET_EARLIEST_MSG_STORETIME = 32
    VIEW_MESSAGE_BY_ID = 33
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    END_TRANSACTION = 37
    GET_CONSUMER_LIST_BY_GROUP = 38
    CHECK_TRANSACTION_STATE = 39
    NOTIFY_CONSUMER_IDS_CHANGED = 40
    LOCK_BATCH_MQ = 41
    UNLOCK_BATCH_MQ = 42
    GET_ALL_CONSUMER_OFFSET = 43
    GET_ALL_DELAY_OFFSET = 45
    CHECK_CLIENT_CONFIG = 46
    GET_CLIENT_CONFIG = 47
    # ACL 1.0 (plain_acl.yml) administration, admin accounts only
    UPDATE_AND_CREATE_ACL_CONFIG = 50
    DELETE_ACL_CONFIG = 51
    GET_BROKER_CLUSTER_ACL_INFO = 52
    UPDATE_GLOBAL_WHITE_ADDRS_CONFIG = 53
    GET_BROKER_CLUSTER_ACL_CONFIG = 54
    GET_TIMER_CHECK_POINT = 60
    GET_TIMER_METRICS = 61

    # -- name server ----------------------------------------------------------------------------------------
    PUT_KV_CONFIG = 100
    GET_KV_CONFIG = 101
    DELETE_KV_CONFIG = 102
    REGISTER_BROKER = 103
    UNREGISTER_BROKER = 104
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106

    # -- admin ----------------------------------------------------------------------------------------------
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG = 201
    GET_TOPIC_STATS_INFO = 202
    GET_CONSUMER_CONNECTION_LIST = 203
    GET_PRODUCER_CONNECTION_LIST = 204
    WIPE_WRITE_PERM_OF_BROKER = 205
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
    DELETE_SUBSCRIPTIONGROUP = 207
    GET_CONSUME_STATS = 208
    SUSPEND_CONSUMER = 209
    RESUME_CONSUMER = 210
    RESET_CONSUMER_OFFSET_IN_CONSUMER = 211
    RESET_CONSUMER_OFFSET_IN_BROKER = 212
    ADJUST_CONSUMER_THREAD_POOL = 213
    WHO_CONSUME_THE_MESSAGE = 214
    DELETE_TOPIC_IN_BROKER = 215
    DELETE_TOPIC_IN_NAMESRV = 216
    REGISTER_TOPIC_IN_NAMESRV = 217
    GET_KVLIST_BY_NAMESPACE = 219
    RESET_CONSUMER_CLIENT_OFFSET = 220
    GET_CONSUMER_STATUS_FROM_CLIENT = 221
    INVOKE_BROKER_TO_RESET_OFFSET = 222
    INVOKE_BROKER_TO_GET_CONSUMER_STATUS = 223
    GET_TOPICS_BY_CLUSTER = 224
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP_LIST = 225
    QUERY_TOPIC_CONSUME_BY_WHO = 300
    REGISTER_FILTER_SERVER = 301
    REGISTER_MESSAGE_FILTER_CLASS = 302
    QUERY_CONSUME_TIME_SPAN = 303
    GET_SYSTEM_TOPIC_LIST_FROM_NS = 304
    GET_SYSTEM_TOPIC_LIST_FROM_BROKER = 305
    CLEAN_EXPIRED_CONSUMEQUEUE = 306
    GET_CONSUMER_RUNNING_INFO = 307
    QUERY_CORRECTION_OFFSET = 308
    CONSUME_MESSAGE_DIRECTLY = 309
    SEND_MESSAGE_V2 = 310
    GET_UNIT_TOPIC_LIST = 311
    GET_HAS_UNIT_SUB_TOPIC_LIST = 312
    GET_HAS_UNIT_SUB_UNUNIT_TOPIC_LIST = 313
    CLONE_GROUP_OFFSET = 314
    VIEW_BROKER_STATS_DATA = 315
    CLEAN_UNUSED_TOPIC = 316
    GET_BROKER_CONSUME_STATS = 317
    UPDATE_NAMESRV_CONFIG = 318
    GET_NAMESRV_CONFIG = 319
    SEND_BATCH_MESSAGE = 320
    QUERY_CONSUME_QUEUE = 321
    QUERY_DATA_VERSION = 322
    RESUME_CHECK_HALF_MESSAGE = 323
    SEND_REPLY_MESSAGE = 324
    SEND_REPLY_MESSAGE_V2 = 325
    PUSH_REPLY_MESSAGE_TO_CLIENT = 326
    ADD_WRITE_PERM_OF_BROKER = 327
    GET_ALL_PRODUCER_INFO = 328
    DELETE_EXPIRED_COMMITLOG = 329
    QUERY_TOPICS_BY_CONSUMER = 343
    QUERY_SUBSCRIPTION_BY_CONSUMER = 345
    GET_TOPIC_CONFIG = 351
    GET_SUBSCRIPTIONGROUP_CONFIG = 352
    LITE_PULL_MESSAGE = 361
    RECALL_MESSAGE = 370
    QUERY_ASSIGNMENT = 400
    SET_MESSAGE_REQUEST_MODE = 401
    GET_ALL_MESSAGE_REQUEST_MODE = 402

    # -- replication and controller (later wave) ----------------------------------------------------------
    GET_BROKER_MEMBER_GROUP = 901
    ADD_BROKER = 902
    REMOVE_BROKER = 903
    BROKER_HEARTBEAT = 904
    NOTIFY_MIN_BROKER_ID_CHANGE = 905
    EXCHANGE_BROKER_HA_INFO = 906
    GET_BROKER_HA_STATUS = 907
    RESET_MASTER_FLUSH_OFFSET = 908
    CONTROLLER_ALTER_SYNC_STATE_SET = 1001
    CONTROLLER_ELECT_MASTER = 1002
    CONTROLLER_REGISTER_BROKER = 1003
    CONTROLLER_GET_REPLICA_INFO = 1004
    CONTROLLER_GET_METADATA_INFO = 1005
    CONTROLLER_GET_SYNC_STATE_DATA = 1006
    GET_BROKER_EPOCH_CACHE = 1007
    NOTIFY_BROKER_ROLE_CHANGED = 1008
    UPDATE_CONTROLLER_CONFIG = 1009
    GET_CONTROLLER_CONFIG = 1010
    CLEAN_BROKER_DATA = 1011
    CONTROLLER_GET_NEXT_BROKER_ID = 1012
    CONTROLLER_APPLY_BROKER_ID = 1013

    # -- POP consumption (5.x). These exceed int16, so they only travel in JSON headers: the binary header's
    # code field is 16 bits wide (RocketMQ briefly renumbered them to 344x and reverted; 2000xx is current).
    POP_MESSAGE = 200050
    ACK_MESSAGE = 200051
    PEEK_MESSAGE = 200052
    CHANGE_MESSAGE_INVISIBLETIME = 200053
    NOTIFICATION = 200054
    POLLING_INFO = 200055
    BATCH_ACK_MESSAGE = 200151

    # -- cometmq extensions: 31000 + the RocketMQ code they extend (see the module docstring) ------------------
    #: many END_TRANSACTIONs in one request (protocol/transaction_batch.py)
    END_TRANSACTION_BATCH = 31037


class ResponseCode(IntEnum):
    # RemotingSysResponseCode: the transport's own codes.
    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    TRANSACTION_FAILED = 4
    # ResponseCode: broker and name server outcomes.
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    VERSION_NOT_SUPPORTED = 15
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    TOPIC_EXIST_ALREADY = 18
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    SUBSCRIPTION_NOT_EXIST = 24
    SUBSCRIPTION_NOT_LATEST = 25
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    FILTER_DATA_NOT_EXIST = 27
    FILTER_DATA_NOT_LATEST = 28
    INVALID_PARAMETER = 29
    TRANSACTION_SHOULD_COMMIT = 200
    TRANSACTION_SHOULD_ROLLBACK = 201
    TRANSACTION_STATE_UNKNOW = 202
    TRANSACTION_STATE_GROUP_WRONG = 203
    NO_BUYER_ID = 204
    NOT_IN_CURRENT_UNIT = 205
    CONSUMER_NOT_ONLINE = 206
    CONSUME_MSG_TIMEOUT = 207
    NO_MESSAGE = 208
    POLLING_FULL = 209
    POLLING_TIMEOUT = 210
    BROKER_NOT_EXIST = 211
    BROKER_DISPATCH_NOT_COMPLETE = 212
    BROADCAST_CONSUMPTION = 213
    FLOW_CONTROL = 215
    NOT_LEADER_FOR_QUEUE = 501
    ILLEGAL_OPERATION = 604
    GO_AWAY = 1500
    # Controller outcomes (later wave).
    CONTROLLER_FENCED_MASTER_EPOCH = 2000
    CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH = 2001
    CONTROLLER_INVALID_MASTER = 2002
    CONTROLLER_INVALID_REPLICAS = 2003
    CONTROLLER_MASTER_NOT_AVAILABLE = 2004
    CONTROLLER_INVALID_REQUEST = 2005
    CONTROLLER_BROKER_NOT_ALIVE = 2006
    CONTROLLER_NOT_LEADER = 2007
    CONTROLLER_BROKER_METADATA_NOT_EXIST = 2008
    CONTROLLER_INVALID_CLEAN_BROKER_METADATA = 2009
    CONTROLLER_BROKER_NEED_TO_BE_REGISTERED = 2010
    CONTROLLER_MASTER_STILL_EXIST = 2011
    CONTROLLER_ELECT_MASTER_FAILED = 2012
    CONTROLLER_ALTER_SYNC_STATE_SET_FAILED = 2013
    CONTROLLER_BROKER_ID_INVALID = 2014
    CONTROLLER_JRAFT_INTERNAL_ERROR = 2015
    CONTROLLER_BROKER_LIVE_INFO_NOT_EXISTS = 2016
    # Never on the wire: RocketMQ clients use these for local transport failures.
    RPC_UNKNOWN = -1000
    RPC_ADDR_IS_NULL = -1002
    RPC_SEND_TO_CHANNEL_FAILED = -1004
    RPC_TIME_OUT = -1006


class LanguageCode(IntEnum):
    """The binary header's language byte; the JSON header carries the member's name instead."""

    JAVA = 0
    CPP = 1
    DOTNET = 2
    PYTHON = 3
    DELPHI = 4
    ERLANG = 5
    RUBY = 6
    OTHER = 7
    HTTP = 8
    GO = 9
    PHP = 10
    OMS = 11
    RUST = 12
    NODE_JS = 13


# A producer sends again on another queue after these (RocketMQ's default producer retry set); the rest are
# final answers about the request itself.
_RETRIABLE = frozenset(
    {
        ResponseCode.SYSTEM_ERROR,
        ResponseCode.SYSTEM_BUSY,
        ResponseCode.SERVICE_NOT_AVAILABLE,
        ResponseCode.TOPIC_NOT_EXIST,
        ResponseCode.NO_PERMISSION,
        ResponseCode.NO_BUYER_ID,
        ResponseCode.NOT_IN_CURRENT_UNIT,
        ResponseCode.FLOW_CONTROL,
    }
)


#: The answer to a request whose header field or body is malformed (a ``RemoteProtocolError`` out of its
#: handler), by request code. The one place that choice is made: the request dispatch looks it up, handlers just
#: parse. Requests not listed get SYSTEM_ERROR, as RocketMQ's processors answer a header they cannot read.
_BAD_REQUEST_CODES: dict[int, ResponseCode] = {
    # a send whose header, properties or batch body are malformed is an illegal message
    RequestCode.SEND_MESSAGE: ResponseCode.MESSAGE_ILLEGAL,
    RequestCode.SEND_MESSAGE_V2: ResponseCode.MESSAGE_ILLEGAL,
    RequestCode.SEND_BATCH_MESSAGE: ResponseCode.MESSAGE_ILLEGAL,
    # POP and its acks: a bad header, extra info (receipt handle) or batch-ack body
    RequestCode.POP_MESSAGE: ResponseCode.MESSAGE_ILLEGAL,
    RequestCode.PEEK_MESSAGE: ResponseCode.MESSAGE_ILLEGAL,
    RequestCode.ACK_MESSAGE: ResponseCode.MESSAGE_ILLEGAL,
    RequestCode.BATCH_ACK_MESSAGE: ResponseCode.MESSAGE_ILLEGAL,
    RequestCode.CHANGE_MESSAGE_INVISIBLETIME: ResponseCode.MESSAGE_ILLEGAL,
    RequestCode.NOTIFICATION: ResponseCode.MESSAGE_ILLEGAL,
    # the name server answers every request a peer got wrong INVALID_PARAMETER
    RequestCode.REGISTER_BROKER: ResponseCode.INVALID_PARAMETER,
    RequestCode.UNREGISTER_BROKER: ResponseCode.INVALID_PARAMETER,
    RequestCode.GET_ROUTEINFO_BY_TOPIC: ResponseCode.INVALID_PARAMETER,
    RequestCode.DELETE_TOPIC_IN_NAMESRV: ResponseCode.INVALID_PARAMETER,
    RequestCode.GET_TOPICS_BY_CLUSTER: ResponseCode.INVALID_PARAMETER,
    RequestCode.QUERY_DATA_VERSION: ResponseCode.INVALID_PARAMETER,
    RequestCode.REGISTER_TOPIC_IN_NAMESRV: ResponseCode.INVALID_PARAMETER,
}


def bad_request_code(request_code: int) -> ResponseCode:
    """The response code for a request of ``request_code`` that the peer got wrong (see ``_BAD_REQUEST_CODES``)."""
    return _BAD_REQUEST_CODES.get(request_code, ResponseCode.SYSTEM_ERROR)


def response_code_name(code: int) -> str:
    """``TOPIC_NOT_EXIST`` for 17, ``UNKNOWN(12345)`` for a code outside the table (peers may be newer)."""
    try:
        return ResponseCode(code).name
    except ValueError:
        return f"UNKNOWN({code})"


class RemotingError(Exception):
    """A failure that has a response code: raised by processors, sent to the peer as ``code`` + ``remark``.

    The client side raises it too, for a reply whose code the caller did not expect. ``code`` stays a plain
    int when the peer sends a number outside our table, so a newer peer's answer is still reported faithfully.
    """

    def __init__(self, code: ResponseCode | int, remark: str = "") -> None:
        try:
            self.code: ResponseCode | int = ResponseCode(code)
        except ValueError:
            self.code = int(code)
        self.remark = remark
        super().__init__(code, remark)

    @property
    def retriable(self) -> bool:
        return self.code in _RETRIABLE

    def __str__(self) -> str:
        name = response_code_name(self.code)
        return f"{name}({int(self.code)}): {self.remark}" if self.remark else f"{name}({int(self.code)})"

    def __repr__(self) -> str:
        return f"RemotingError({response_code_name(self.code)}, {self.remark!r})"
