"""The login's parts without a browser: the users file (rocketmq-dashboard's format, hashed passwords), the
signed session cookies, the CSRF tokens and the failed-login throttle."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

pytest.importorskip("aiohttp")  # the dashboard extra

from cometmq.dashboard.auth import (
    LoginThrottle,
    Sessions,
    UsersFile,
    UsersFileError,
    hash_password,
    parse_users,
    stand_in_secret,
    verify_password,
)


def test_users_file_format_and_password_forms() -> None:
    scrypt = hash_password("s3cret", n=1 << 10)
    users = parse_users("# rocketmq-dashboard's example\n! also a comment\nsuper=admin,1\nuser1 = user1\n"
                        f"hashed=sha256:{hashlib.sha256(b'pw,1').hexdigest()},0\nsalted:{scrypt},1\n"
                        "odd=plain:sha256:x\ncomma=a,b\n")
    assert {n: u.admin for n, u in users.items()} == {"super": True, "user1": False, "hashed": False,
                                                     "salted": True, "odd": False, "comma": False}
    assert verify_password(users["super"].secret, "admin") and not verify_password(users["super"].secret, "admin,1")
    assert verify_password(users["user1"].secret, "user1")
    assert verify_password(users["hashed"].secret, "pw,1") and not verify_password(users["hashed"].secret, "pw")
    assert verify_password(users["salted"].secret, "s3cret") and not verify_password(users["salted"].secret, "s3cre")
    assert verify_password(users["odd"].secret, "sha256:x")
    assert verify_password(users["comma"].secret, "a,b")
    assert scrypt != hash_password("s3cret", n=1 << 10)  # salted


@pytest.mark.parametrize("text, error", [
    ("", "no user"), ("justaname\n", "line 1"), ("a=x\na=y\n", "defined twice"), ("a=sha256:abc\n", "64 hex"),
    ("a=scrypt:1:2\n", "scrypt:N:r:p"), ("=pw\n", "line 1")])
def test_bad_users_files_say_where(text: str, error: str) -> None:
    with pytest.raises(UsersFileError, match=error):
        parse_users(text)


def test_users_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "users.properties"
    path.write_text("a=one,1\n")
    users = UsersFile(path)
    assert users.authenticate("a", "one") is not None and users.authenticate("a", "two") is None
    assert users.authenticate("nobody", "one") is None
    path.write_text("a=two\n")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    users._checked -= 2  # the file is looked at once a second at most
    user = users.authenticate("a", "two")
    assert user is not None and not user.admin
    path.write_text("broken\n")
    users._checked -= 2
    assert users.get("a") is not None  # a bad file is logged; the users before stay


def test_an_unknown_name_costs_what_a_wrong_password_costs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Login time must not tell which user names exist: an unknown name's password is checked against a stand-in
    of the form (and scrypt cost) most users have. It used to be a sha256 check (~1 µs against scrypt's ~50 ms)."""
    a, b = hash_password("a", n=1 << 11), hash_password("b", n=1 << 11)
    users = parse_users(f"u1={a}\nu2={b},1\nu3=plain-pw\n")
    assert stand_in_secret(users).startswith("scrypt:2048:8:1:")
    assert stand_in_secret(parse_users("u1=x\nu2=sha256:" + "0" * 64 + "\n")).startswith("sha256:")
    path = tmp_path / "users.properties"
    path.write_text(f"u1={a}\nu2={b}\n")
    costs: list[int] = []
    real = hashlib.scrypt

    def counted(password: bytes, **kw: int) -> bytes:
        costs.append(kw["n"])
        return real(password, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(hashlib, "scrypt", counted)
    users_file = UsersFile(path)
    assert users_file.authenticate("u1", "wrong") is None and users_file.authenticate("nobody", "a") is None
    assert costs == [2048, 2048]  # one scrypt of the same cost for the wrong password and for the unknown name
    assert users_file.authenticate("u1", "a") is not None


def test_sessions_are_signed_expire_and_can_be_revoked() -> None:
    users = parse_users("a=one,1\n")
    sessions = Sessions("a secret", ttl=60)
    cookie, s = sessions.issue(users["a"], now=1000)
    assert sessions.read(cookie, now=1001) == s
    assert sessions.read(cookie, now=1061) is None  # expired
    body, mac = cookie.split(".")
    assert sessions.read(body + "." + mac[:-2] + ("AA" if mac[-2:] != "AA" else "BB"), now=1001) is None
    assert Sessions("another secret").read(cookie, now=1001) is None
    assert Sessions("a secret").read(cookie, now=1001) == s  # the same secret: sessions outlive a restart
    assert Sessions().read(cookie, now=1001) is None  # a random key
    token = sessions.csrf_token(s)
    assert sessions.csrf_ok(s, token) and not sessions.csrf_ok(s, "") and not sessions.csrf_ok(s, token[:-1] + "x")
    _, s2 = sessions.issue(users["a"], now=1000)
    assert not sessions.csrf_ok(s2, token)
    sessions.revoke(s, now=1002)
    assert sessions.read(cookie, now=1003) is None


def test_failed_logins_lock_an_address_out() -> None:
    t = LoginThrottle(max_failures=3, window=900, lockout=30)
    assert [t.failed("10.0.0.1", now=i) for i in range(3)] == [0, 0, 30]
    assert t.retry_after("10.0.0.1", now=10) == 22 and t.retry_after("10.0.0.2", now=10) == 0
    assert [t.failed("10.0.0.1", now=40 + i) for i in range(3)] == [0, 0, 60]  # doubled
    t.succeeded("10.0.0.1")
    assert t.retry_after("10.0.0.1", now=50) == 0
    assert [t.failed("10.0.0.3", now=i * 1000) for i in range(5)] == [0] * 5  # spread out: no lock-out
    small = LoginThrottle(max_failures=3, max_addresses=100)
    for i in range(1000):
        small.failed(f"10.1.{i // 250}.{i % 250}", now=float(i))
    assert len(small._by_addr) <= 100
