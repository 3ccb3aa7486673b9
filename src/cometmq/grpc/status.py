"""gRPC status codes (``apache.rocketmq.v2.Code``) and the translation of remoting response codes into them."""

from __future__ import annotations

from cometmq.grpc.v2 import definition_pb2 as pb
from cometmq.protocol.codes import ResponseCode

Code = pb.Code


class GrpcError(Exception):
    """A failure that becomes a response ``status`` (code + message) rather than a gRPC transport error."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{pb.Code.Name(self.code) if self.code in pb.Code.values() else self.code}: {self.message}"


def status(code: int = pb.Code.OK, message: str = "OK") -> pb.Status:
    return pb.Status(code=code, message=message)  # type: ignore[arg-type]


OK_STATUS = status()

#: remoting response code -> gRPC code (what RocketMQ's proxy reports for the same broker answer)
_FROM_REMOTING: dict[int, int] = {
    ResponseCode.SUCCESS: pb.Code.OK,
    ResponseCode.SYSTEM_ERROR: pb.Code.INTERNAL_SERVER_ERROR,
    ResponseCode.SYSTEM_BUSY: pb.Code.TOO_MANY_REQUESTS,
    ResponseCode.REQUEST_CODE_NOT_SUPPORTED: pb.Code.UNSUPPORTED,
    ResponseCode.FLUSH_DISK_TIMEOUT: pb.Code.MASTER_PERSISTENCE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: pb.Code.HA_NOT_AVAILABLE,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: pb.Code.SLAVE_PERSISTENCE_TIMEOUT,
    ResponseCode.MESSAGE_ILLEGAL: pb.Code.BAD_REQUEST,
    ResponseCode.SERVICE_NOT_AVAILABLE: pb.Code.INTERNAL_SERVER_ERROR,
    ResponseCode.NO_PERMISSION: pb.Code.FORBIDDEN,
    ResponseCode.TOPIC_NOT_EXIST: pb.Code.TOPIC_NOT_FOUND,
    ResponseCode.PULL_NOT_FOUND: pb.Code.MESSAGE_NOT_FOUND,
    ResponseCode.POLLING_TIMEOUT: pb.Code.MESSAGE_NOT_FOUND,
    ResponseCode.NO_MESSAGE: pb.Code.INVALID_RECEIPT_HANDLE,
    ResponseCode.QUERY_NOT_FOUND: pb.Code.OFFSET_NOT_FOUND,
    ResponseCode.SUBSCRIPTION_PARSE_FAILED: pb.Code.ILLEGAL_FILTER_EXPRESSION,
    ResponseCode.SUBSCRIPTION_NOT_EXIST: pb.Code.CONSUMER_GROUP_NOT_FOUND,
    ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST: pb.Code.CONSUMER_GROUP_NOT_FOUND,
    ResponseCode.POLLING_FULL: pb.Code.TOO_MANY_REQUESTS,
    ResponseCode.FLOW_CONTROL: pb.Code.TOO_MANY_REQUESTS,
    ResponseCode.ILLEGAL_OPERATION: pb.Code.BAD_REQUEST,
    ResponseCode.INVALID_PARAMETER: pb.Code.BAD_REQUEST,
}


def from_remoting(code: int) -> int:
    """The gRPC code for a broker's remoting response code; unknown failures are internal errors."""
    return _FROM_REMOTING.get(code, pb.Code.INTERNAL_SERVER_ERROR)
