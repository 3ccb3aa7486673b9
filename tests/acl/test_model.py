"""The ACL model: the remoting signature (by hand, as RocketMQ's AclUtils computes it), plain_acl.yml reading and
its errors, address patterns, permissions, hot reload and the refusal log."""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import time
from pathlib import Path

import pytest

from cometmq.acl import AccessControl, AccessDenied, AclConfigError, AddressPattern, Attempt, parse_acl
from cometmq.acl.model import DENY, PUB, SUB, check_permission
from cometmq.acl.policy import BROKER_POLICY, NAMESRV_POLICY, Need
from cometmq.acl.yamlite import dumps, loads
from cometmq.protocol.acl import Credentials, calc_signature, sign_request, signed_content
from cometmq.protocol.codes import RequestCode
from cometmq.protocol.remoting import make_request

ROCKETMQ_EXAMPLE = """\
globalWhiteRemoteAddresses:
  - 10.10.103.*
  - 192.168.0.*

accounts:
  - accessKey: RocketMQ
    secretKey: 12345678
    whiteRemoteAddress:
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - topicA=DENY
      - topicB=PUB|SUB
      - topicC=SUB
    groupPerms:
      # the group should convert to retry topic
      - groupA=DENY
      - groupB=PUB|SUB
      - groupC=SUB

  - accessKey: rocketmq2
    secretKey: 12345678
    whiteRemoteAddress: 192.168.1.*
    # if it is admin, it could access all resources
    admin: true
"""


# -- the signature -------------------------------------------------------------------------------------------------
def test_signature_is_hmac_sha1_over_sorted_values_then_body() -> None:
    fields = {"topic": "T", "AccessKey": "RocketMQ", "b": "x", "Signature": "ignored", "_UNIQUE_KEY_QUERY": "f"}
    # keys sorted: AccessKey, b, topic (Signature and _UNIQUE_KEY_QUERY left out); values only, then the body
    content = b"RocketMQ" + b"x" + b"T" + b"hello"
    assert signed_content(fields, b"hello") == content
    by_hand = base64.b64encode(hmac.new(b"12345678", content, hashlib.sha1).digest()).decode()
    assert calc_signature(content, "12345678") == by_hand
    # the same vector from another implementation: printf 'RocketMQxThello' | openssl dgst -sha1 -hmac 12345678
    # -binary | base64
    assert by_hand == "F5OXz6yI9UXc4zQMvVBcpXF4d1k="


def test_sign_request_adds_access_key_and_signature() -> None:
    cmd = make_request(RequestCode.SEND_MESSAGE, {"topic": "T", "queueId": 1}, b"body")
    signed = sign_request(cmd, Credentials("RocketMQ", "12345678"))
    assert signed.ext_fields["AccessKey"] == "RocketMQ"
    expected = calc_signature(b"RocketMQ" + b"1" + b"T" + b"body", "12345678")
    assert signed.ext_fields["Signature"] == expected
    assert "12345678" not in repr(Credentials("RocketMQ", "12345678"))


# -- the file ----------------------------------------------------------------------------------------------------
def test_rocketmq_example_file_reads() -> None:
    acl = parse_acl(ROCKETMQ_EXAMPLE)
    a = acl.accounts["RocketMQ"]
    assert a.secret_key == "12345678" and not a.admin and a.white_remote_address is None
    assert a.default_topic_perm == DENY and a.default_group_perm == SUB
    assert a.topic_perms == {"topicA": DENY, "topicB": PUB | SUB, "topicC": SUB}
    assert a.group_perms == {"groupA": DENY, "groupB": PUB | SUB, "groupC": SUB}
    assert acl.accounts["rocketmq2"].admin
    assert [p.text for p in acl.global_white] == ["10.10.103.*", "192.168.0.*"]
    again = parse_acl(acl.dumps())
    assert again.accounts == acl.accounts


@pytest.mark.parametrize(("text", "where"), [
    ("accounts:\n  - accessKey: RocketMQ\n    secretKey: 12345678\n    defaultTopicPerm: PUBLISH\n",
     "line 4 (accounts[0].defaultTopicPerm)"),
    ("accounts:\n  - accessKey: short\n    secretKey: 12345678\n", "line 2 (accounts[0].accessKey)"),
    ("accounts:\n  - accessKey: RocketMQ\n    secretKey: 12345678\n    topicPerms:\n      - topicA\n",
     "line 4 (accounts[0].topicPerms)"),
    ("accounts:\n  - accessKey: RocketMQ\n    secretKey: 12345678\n    colour: blue\n", "line 4 (accounts[0].colour)"),
    ("globalWhiteRemoteAddresses:\n  - 10.1.*.7\n", "line 2 (globalWhiteRemoteAddresses[0])"),
    ("acounts: []\n", "line 1 (acounts)"),
    ("accounts:\n  - accessKey: RocketMQ\n\tsecretKey: x\n", "line 3"),
    ("accounts:\n  - accessKey: RocketMQ\n    secretKey: 12345678\n  - accessKey: RocketMQ\n    secretKey: 1234567\n",
     "line 4 (accounts[1].accessKey)"),
    ("globalWhiteRemoteAddresses: *\n", "line 1"),
])
def test_bad_files_name_the_line_and_key(text: str, where: str) -> None:
    with pytest.raises(AclConfigError) as err:
        parse_acl(text, "acl.yml")
    assert f"acl.yml {where}" in str(err.value) or f"acl.yml: {where}" in str(err.value), str(err.value)


def test_yaml_subset_round_trip() -> None:
    value = {"a": ["x=1", "10.0.0.*", "it's", "true"], "b": [{"c": 1, "d": None}], "e": "192.168.1.{1,2}"}
    assert loads(dumps(value)).value == value
    assert loads("k: [a, 'b c', 3]\n").value == {"k": ["a", "b c", 3]}


# -- addresses and permissions -------------------------------------------------------------------------------
@pytest.mark.parametrize(("pattern", "yes", "no"), [
    ("*", ["1.2.3.4", "::1"], []),
    ("192.168.0.*", ["192.168.0.1", "192.168.0.255"], ["192.168.1.1", "10.0.0.1"]),
    ("192.168.*.*", ["192.168.7.9"], ["192.169.0.1"]),
    ("10.10.103.80,10.10.103.81", ["10.10.103.80", "10.10.103.81"], ["10.10.103.82"]),
    ("192.168.1.{1,2}", ["192.168.1.1", "192.168.1.2"], ["192.168.1.3"]),
    ("10.0.0.10-20", ["10.0.0.10", "10.0.0.20"], ["10.0.0.9", "10.0.0.21"]),
    ("127.0.0.1", ["127.0.0.1", "::ffff:127.0.0.1"], ["127.0.0.2"]),
])
def test_address_patterns(pattern: str, yes: list[str], no: list[str]) -> None:
    p = AddressPattern.parse(pattern)
    assert p is not None
    assert all(p.match(h) for h in yes) and not any(p.match(h) for h in no)


def test_blank_pattern_matches_nothing_and_bad_ones_raise() -> None:
    assert AddressPattern.parse("") is None and AddressPattern.parse(None) is None
    for bad in ("10.0.*.1", "300.1.1.1", "10.0.0.20-10", "host.example"):
        with pytest.raises(ValueError):
            AddressPattern.parse(bad)


def test_check_permission_is_rocketmqs() -> None:
    assert check_permission(PUB, PUB | SUB) and check_permission(SUB, SUB)
    assert not check_permission(PUB, SUB) and not check_permission(SUB, DENY | SUB)
    assert check_permission(2, PUB) and not check_permission(2, DENY)  # ANY


# -- the check ----------------------------------------------------------------------------------------------
def _attempt(ak: str | None, sk: str, code: int, needs: list[Need], host: str = "127.0.0.1") -> Attempt:
    cmd = make_request(code, {"x": "1"})
    signed = sign_request(cmd, Credentials(ak or "", sk))
    fields = signed.ext_fields

    def verify(secret: str) -> bool:
        return hmac.compare_digest(calc_signature(signed_content(fields, b""), secret), fields["Signature"])

    return Attempt(host, ak, verify, code, BROKER_POLICY.is_admin(code), needs)


def test_check_order_and_remarks() -> None:
    ac = AccessControl.from_config(parse_acl(ROCKETMQ_EXAMPLE))
    send = RequestCode.SEND_MESSAGE
    with pytest.raises(AccessDenied, match="No accessKey is configured"):
        ac.check(_attempt(None, "", send, []))
    with pytest.raises(AccessDenied, match="No acl config for nobody00"):
        ac.check(_attempt("nobody00", "12345678", send, []))
    with pytest.raises(AccessDenied, match="Check signature failed for accessKey=RocketMQ"):
        ac.check(_attempt("RocketMQ", "wrong-secret", send, []))
    ac.check(_attempt("RocketMQ", "12345678", send, [Need("topicB", False, PUB)]))
    with pytest.raises(AccessDenied, match="topic=topicA"):  # named DENY beats the default
        ac.check(_attempt("RocketMQ", "12345678", send, [Need("topicA", False, PUB)]))
    with pytest.raises(AccessDenied, match="topic=other"):  # defaultTopicPerm DENY
        ac.check(_attempt("RocketMQ", "12345678", send, [Need("other", False, PUB)]))
    ac.check(_attempt("RocketMQ", "12345678", send, [Need("anyGroup", True, SUB)]))  # defaultGroupPerm SUB
    with pytest.raises(AccessDenied, match="Need admin permission for request code=17"):
        ac.check(_attempt("RocketMQ", "12345678", RequestCode.UPDATE_AND_CREATE_TOPIC, []))
    ac.check(_attempt("rocketmq2", "12345678", RequestCode.UPDATE_AND_CREATE_TOPIC, []))
    # the global allow-list needs no credentials at all; the account's own list no signature
    ac.check(_attempt(None, "", RequestCode.DELETE_TOPIC_IN_BROKER, [], host="10.10.103.7"))
    ac.check(_attempt("rocketmq2", "wrong-secret", send, [], host="192.168.1.9"))


def test_a_trace_send_lets_only_itself_through() -> None:
    ac = AccessControl.from_config(parse_acl(ROCKETMQ_EXAMPLE))
    send, trace = RequestCode.SEND_MESSAGE, Need("RMQ_SYS_TRACE_TOPIC", False, PUB)
    ac.check(_attempt("RocketMQ", "12345678", send, [trace]))  # defaultTopicPerm DENY, but traces always go
    # the other topics of the same request (a gRPC SendMessage of several, a producer's settings) are checked
    with pytest.raises(AccessDenied, match="topic=topicA"):
        ac.check(_attempt("RocketMQ", "12345678", send, [trace, Need("topicA", False, PUB)]))
    with pytest.raises(AccessDenied, match="Check signature failed"):  # and the signature still is
        ac.check(_attempt("RocketMQ", "wrong-secret", send, [trace]))


def test_policies() -> None:
    pull = make_request(RequestCode.PULL_MESSAGE, {"topic": "T", "consumerGroup": "G"})
    assert BROKER_POLICY.needs_of(pull) == [Need("T", False, SUB), Need("G", True, SUB)]
    retry = make_request(RequestCode.SEND_MESSAGE_V2, {"b": "%RETRY%G", "a": "pg"})
    assert BROKER_POLICY.needs_of(retry) == [Need("G", True, SUB)]
    for code in (17, 215, 200, 207, 25, 222, 50, 51, 52):
        assert BROKER_POLICY.is_admin(code), code
    assert not BROKER_POLICY.is_admin(RequestCode.SEND_MESSAGE)
    assert NAMESRV_POLICY.is_admin(RequestCode.DELETE_TOPIC_IN_NAMESRV)
    assert NAMESRV_POLICY.is_admin(RequestCode.UNREGISTER_BROKER)
    assert RequestCode.GET_ROUTEINFO_BY_TOPIC in NAMESRV_POLICY.public_codes


# -- hot reload and the refusal log ----------------------------------------------------------------------------------
def _write(path: Path, text: str) -> None:
    path.write_text(text)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # a new mtime even on coarse clocks


def test_hot_reload_keeps_the_old_acl_on_a_bad_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "plain_acl.yml"
    _write(path, ROCKETMQ_EXAMPLE)
    ac = AccessControl(path)
    ac.load()
    assert set(ac.config.accounts) == {"RocketMQ", "rocketmq2"}
    assert not ac.reload_if_changed()
    _write(path, ROCKETMQ_EXAMPLE.replace("rocketmq2", "rocketmq3"))
    assert not ac.reload_if_changed()  # a change is put in force once the next look reads the same file
    assert ac.reload_if_changed()
    assert set(ac.config.accounts) == {"RocketMQ", "rocketmq3"}
    with caplog.at_level(logging.ERROR, "cometmq.acl"):
        _write(path, "accounts:\n  - accessKey: RocketMQ\n    secretKey: 12345678\n    admin: maybe\n")
        for _ in range(3):  # one error per bad version, not one per poll
            assert not ac.reload_if_changed()
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "line 4" in errors[0].getMessage() and "admin" in errors[0].getMessage()
    assert set(ac.config.accounts) == {"RocketMQ", "rocketmq3"}


async def test_watcher_picks_up_changes(tmp_path: Path) -> None:
    import asyncio

    path = tmp_path / "plain_acl.yml"
    ac = AccessControl(path, reload_interval_s=0.05)
    ac.load()  # missing: an empty ACL
    assert not ac.config.accounts
    ac.start()
    try:
        _write(path, ROCKETMQ_EXAMPLE)
        deadline = time.monotonic() + 5
        while not ac.config.accounts and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert "RocketMQ" in ac.config.accounts
    finally:
        await ac.stop()


def test_refusals_are_logged_once_per_client_and_reason(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    ac = AccessControl(os.devnull, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, "cometmq.acl"):
        for _ in range(100):
            ac.refused("10.0.0.1", "No accessKey is configured", "request code 17")
        ac.refused("10.0.0.2", "No accessKey is configured", "request code 17")
        now[0] = 61
        ac.refused("10.0.0.1", "No accessKey is configured", "request code 17")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert "99 more refusals" in lines[2]


def test_a_host_refused_for_a_new_reason_each_time_is_logged_a_few_times_a_minute(
        caplog: pytest.LogCaptureFixture) -> None:
    """A made-up access key per request is a new reason each time: the once-per-reason limit alone logged every
    request. A host gets LINES_PER_HOST lines a minute; the rest are counted in its next line."""
    from cometmq.acl.control import LINES_PER_HOST

    now = [0.0]
    ac = AccessControl(os.devnull, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, "cometmq.acl"):
        for i in range(500):
            ac.refused("10.0.0.1", f"No acl config for made-up-{i}", "request code 10")
        ac.refused("10.0.0.2", "No acl config for made-up-0", "request code 10")  # another host: its own lines
        now[0] = 61
        ac.refused("10.0.0.1", "No accessKey is configured", "request code 10")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == LINES_PER_HOST + 2
    assert f"{500 - LINES_PER_HOST} refusals of 10.0.0.1 for other reasons were not logged" in lines[-1]
    assert len(ac._logged) == LINES_PER_HOST + 2


def test_a_file_that_is_not_utf8_is_a_config_error(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A file saved in Latin-1 (a secret key with an accented letter) raised UnicodeDecodeError: a traceback instead
    of the file's name at start, and on a hot reload an exception logged at every poll (the watcher never took
    note of that version of the file)."""
    path = tmp_path / "plain_acl.yml"
    path.write_bytes(ROCKETMQ_EXAMPLE.replace("12345678", "s\xe9cret12").encode("latin-1"))
    with pytest.raises(AclConfigError, match=r"plain_acl\.yml is not UTF-8"):
        AccessControl(path).load()
    _write(path, ROCKETMQ_EXAMPLE)
    ac = AccessControl(path)
    ac.load()
    path.write_bytes(ROCKETMQ_EXAMPLE.replace("rocketmq2", "rocketm\xe92").encode("latin-1"))
    with caplog.at_level(logging.ERROR, "cometmq.acl"):
        for _ in range(3):
            assert not ac.reload_if_changed()
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "UTF-8" in errors[0].getMessage()
    assert set(ac.config.accounts) == {"RocketMQ", "rocketmq2"}
