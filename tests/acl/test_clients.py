"""Credentials in the clients: the SDK's ways of giving them, the Spark options, the Spark reader's signed pulls."""

from __future__ import annotations

import pytest

from cometmq.client.errors import InvalidArgumentError
from cometmq.client.instance import ClientInstance, credentials_of
from cometmq.protocol.acl import Credentials, calc_signature, signed_content
from cometmq.protocol.codes import RequestCode
from cometmq.protocol.remoting import make_request


def test_sdk_credentials_forms() -> None:
    assert credentials_of(None) is None
    assert credentials_of(("akakak1", "sksksk1")) == Credentials("akakak1", "sksksk1")
    assert credentials_of(None, "akakak1", "sksksk1") == Credentials("akakak1", "sksksk1")
    with pytest.raises(InvalidArgumentError):
        credentials_of(None, "akakak1", None)
    with pytest.raises(InvalidArgumentError):
        credentials_of(("a", "b"), "akakak1", "sksksk1")
    inst = ClientInstance("127.0.0.1:9876", credentials=("akakak1", "sksksk1"))
    signed = inst.sign(make_request(RequestCode.GET_MAX_OFFSET, {"topic": "T", "queueId": 0}))
    assert signed.ext_fields["AccessKey"] == "akakak1"
    assert signed.ext_fields["Signature"] == calc_signature(signed_content(signed.ext_fields, b""), "sksksk1")
    plain = ClientInstance("127.0.0.1:9876")
    cmd = make_request(RequestCode.GET_MAX_OFFSET, {"topic": "T"})
    assert plain.sign(cmd) is cmd


def test_spark_options_and_signed_pulls() -> None:
    pytest.importorskip("pyarrow")
    from cometmq.spark.options import OptionError, parse_read, parse_write
    from cometmq.spark.reader import _PullFrames

    opts = parse_read({"namesrv": "127.0.0.1:9876", "subscribe": "T", "accessKey": "akakak1",
                       "secretKey": "sksksk1"}, streaming=False)
    assert opts.credentials == ("akakak1", "sksksk1")
    assert parse_write({"namesrv": "127.0.0.1:9876", "accessKey": "akakak1",
                        "secretKey": "sksksk1"}).credentials == ("akakak1", "sksksk1")
    assert parse_write({"namesrv": "127.0.0.1:9876"}).credentials is None
    with pytest.raises(OptionError, match="go together"):
        parse_write({"namesrv": "127.0.0.1:9876", "accessKey": "akakak1"})
    frames = _PullFrames({"consumerGroup": "G", "topic": "T", "queueId": "0"}, ("akakak1", "sksksk1"))
    assert frames.template is None  # the signature changes with the offset: no frame template
    cmd = frames._command(7, 100, 32)
    assert cmd.ext_fields["Signature"] == calc_signature(signed_content(cmd.ext_fields, b""), "sksksk1")
    assert _PullFrames({"consumerGroup": "G", "topic": "T", "queueId": "0"}).template is not None
