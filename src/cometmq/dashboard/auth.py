"""The dashboard's login (docs/dashboard.md, "Login"): rocketmq-dashboard's users file, signed session cookies,
per-session CSRF tokens and a throttle on failed logins. Stdlib only (hashlib, hmac, secrets).

* Users file (``--users-file``; rocketmq-dashboard's ``users.properties``): ``name=password[,1]``, ``,1`` marks an
  admin (who may act; the others read). A password may be given hashed: ``sha256:<hex>`` (``printf %s PW |
  sha256sum``) or ``scrypt:N:r:p:<salt b64>:<hash b64>`` (``python -m cometmq.dashboard.passwd``); ``plain:PW`` is a
  clear password that starts with one of those words. The file is read again when it changes (at most once a
  second, at a login or a request), so users and roles can change without a restart.
* Sessions: the cookie holds ``user, issued, expires, session id, password fingerprint`` signed with HMAC-SHA256
  (a key made at start, or from ``--session-secret`` so that sessions outlive a restart and several dashboards
  share them). The role is read from the users file at each request; a changed password or a removed user ends
  the user's sessions; logout revokes the session id until its expiry.
* CSRF: each session has a token, HMAC(key, session id), put in every form and checked on every POST.
* Throttle: ``max_failures`` failed logins from one client address within ``window`` seconds lock that address
  out for ``lockout`` seconds (doubling on each further lock-out, at most ``window``)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import os
import secrets
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

#: scrypt's cost for new hashes: 16 MiB and ~50 ms per check on a small machine
SCRYPT_N, SCRYPT_R, SCRYPT_P = 1 << 14, 8, 1
_SCRYPT_MAXMEM = 256 * 1024 * 1024
COOKIE = "cometmq_session"


class UsersFileError(ValueError):
    """A users file that cannot be read (the message names the file and the line)."""


@dataclass(frozen=True, slots=True)
class User:
    name: str
    #: the password as written in the file (clear, ``sha256:…``, ``scrypt:…`` or ``plain:…``)
    secret: str
    admin: bool

    @property
    def fingerprint(self) -> str:
        """Changes when the password entry changes: sessions carry it, so a new password ends old sessions."""
        return hashlib.sha256(("cometmq-dashboard-pw\0" + self.secret).encode()).hexdigest()[:16]


def hash_password(password: str, *, n: int = SCRYPT_N, r: int = SCRYPT_R, p: int = SCRYPT_P) -> str:
    """The ``scrypt:N:r:p:salt:hash`` form of ``password`` (a fresh 16-byte salt) for the users file."""
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, maxmem=_SCRYPT_MAXMEM, dklen=32)
    return f"scrypt:{n}:{r}:{p}:{_b64(salt)}:{_b64(digest)}"


def check_secret_form(secret: str) -> None:
    """Raise ValueError when a hashed password is malformed (at load time, not at the first login)."""
    if secret.startswith("sha256:"):
        hexpart = secret[len("sha256:"):].strip()
        if len(hexpart) != 64 or any(c not in "0123456789abcdefABCDEF" for c in hexpart):
            raise ValueError("a sha256: password needs 64 hex digits")
    elif secret.startswith("scrypt:"):
        _scrypt_parts(secret)


def _scrypt_parts(secret: str) -> tuple[int, int, int, bytes, bytes]:
    parts = secret.split(":")
    if len(parts) != 6:
        raise ValueError("a scrypt: password is scrypt:N:r:p:<salt base64>:<hash base64>")
    try:
        n, r, p = int(parts[1]), int(parts[2]), int(parts[3])
        salt, digest = _unb64(parts[4]), _unb64(parts[5])
    except (ValueError, binascii.Error):
        raise ValueError("a scrypt: password is scrypt:N:r:p:<salt base64>:<hash base64>") from None
    if n < 2 or n & (n - 1) or r < 1 or p < 1 or not salt or len(digest) < 16:
        raise ValueError("a scrypt: password needs N a power of 2, r and p >= 1, a salt and a hash of 16+ bytes")
    return n, r, p, salt, digest


def verify_password(secret: str, given: str) -> bool:
    """``given`` against a users-file password, in constant time for a given form (hmac.compare_digest on
    digests of equal length)."""
    g = given.encode()
    if secret.startswith("sha256:"):
        want = bytes.fromhex(secret[len("sha256:"):].strip())
        return hmac.compare_digest(hashlib.sha256(g).digest(), want)
    if secret.startswith("scrypt:"):
        n, r, p, salt, digest = _scrypt_parts(secret)
        got = hashlib.scrypt(g, salt=salt, n=n, r=r, p=p, maxmem=_SCRYPT_MAXMEM, dklen=len(digest))
        return hmac.compare_digest(got, digest)
    clear = secret[len("plain:"):] if secret.startswith("plain:") else secret
    # digests first: equal lengths, so the time does not tell the password's length
    return hmac.compare_digest(hashlib.sha256(g).digest(), hashlib.sha256(clear.encode()).digest())


def stand_in_secret(users: dict[str, User]) -> str:
    """What an unknown user name's password is checked against: the form (and scrypt cost) most of ``users`` have,
    with a random hash nothing matches, so that an unknown name takes as long as a wrong password of a user."""
    forms = Counter(_cost_form(u.secret) for u in users.values())
    form = max(forms, key=lambda f: (forms[f], f)) if forms else "sha256"
    if form == "sha256":
        return "sha256:" + secrets.token_hex(32)
    n, r, p = (int(x) for x in form.split(":")[1:])
    return f"scrypt:{n}:{r}:{p}:{_b64(secrets.token_bytes(16))}:{_b64(secrets.token_bytes(32))}"


def _cost_form(secret: str) -> str:
    if secret.startswith("scrypt:"):
        n, r, p, _, _ = _scrypt_parts(secret)
        return f"scrypt:{n}:{r}:{p}"
    return "sha256"  # clear and plain: passwords are compared as sha256 digests too


def parse_users(text: str, source: str = "users file") -> dict[str, User]:
    """rocketmq-dashboard's users.properties: ``name=password[,1]`` per line (``:`` works as ``=``), ``#`` and
    ``!`` start comments; ``,1`` makes the user an admin (``,0`` or nothing: read only)."""
    users: dict[str, User] = {}
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        cut = [i for i in (line.find("="), line.find(":")) if i > 0]
        if not cut:
            raise UsersFileError(f"{source} line {no}: expected name=password[,1]")
        name, value = line[:min(cut)].strip(), line[min(cut) + 1:].strip()
        admin = False
        head, comma, tail = value.rpartition(",")
        if comma and tail.strip() in ("0", "1"):
            value, admin = head.strip(), tail.strip() == "1"
        if not name or not value:
            raise UsersFileError(f"{source} line {no}: a user needs a name and a password")
        if name in users:
            raise UsersFileError(f"{source} line {no}: user {name!r} is defined twice")
        try:
            check_secret_form(value)
        except ValueError as exc:
            raise UsersFileError(f"{source} line {no} (user {name}): {exc}") from None
        users[name] = User(name, value, admin)
    if not users:
        raise UsersFileError(f"{source}: no user defined (name=password[,1] per line)")
    return users


class UsersFile:
    """The users file, read at start (an error stops the start) and again when it changes (an error then is
    logged and the previous users stay in force)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._stamp = self._stat()
        try:
            text = self.path.read_text(encoding="utf-8")
        except OSError as exc:
            raise UsersFileError(f"cannot read the users file {self.path}: {exc}") from None
        self.users = parse_users(text, str(self.path))
        self._stand_in = stand_in_secret(self.users)
        self._checked = time.monotonic()
        self._mode_warned = False
        self._warn_mode()

    def _stat(self) -> tuple[int, int]:
        try:
            st = self.path.stat()
        except OSError:
            return (-1, -1)
        return (st.st_mtime_ns, st.st_size)

    def _warn_mode(self) -> None:
        try:
            mode = self.path.stat().st_mode
        except OSError:
            return
        if mode & 0o077 and not self._mode_warned and any(
                not u.secret.startswith(("sha256:", "scrypt:")) for u in self.users.values()):
            self._mode_warned = True
            log.warning("the dashboard users file %s holds clear passwords and is readable by others (chmod 600, "
                        "or hash them: python -m cometmq.dashboard.passwd)", self.path)

    def get(self, name: str) -> User | None:
        self._maybe_reload()
        return self.users.get(name)

    def _maybe_reload(self) -> None:
        now = time.monotonic()
        if now - self._checked < 1.0:
            return
        self._checked = now
        stamp = self._stat()
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            self.users = parse_users(self.path.read_text(encoding="utf-8"), str(self.path))
            self._stand_in = stand_in_secret(self.users)
            log.info("dashboard users file %s read again: %d users", self.path, len(self.users))
            self._warn_mode()
        except (OSError, UsersFileError) as exc:
            log.error("dashboard users file not read again, the previous users stay: %s", exc)

    def authenticate(self, name: str, password: str) -> User | None:
        user = self.get(name)
        ok = verify_password(user.secret if user is not None else self._stand_in, password)
        return user if ok and user is not None else None


@dataclass(frozen=True, slots=True)
class Session:
    user: str
    sid: str
    issued: float
    expires: float
    fingerprint: str


class Sessions:
    """Signed, expiring session cookies; logout revokes a session id until it would have expired."""

    def __init__(self, secret: str | bytes | None = None, ttl: float = 8 * 3600) -> None:
        if secret is None or secret == "":
            self.key = secrets.token_bytes(32)
        else:
            raw = secret.encode() if isinstance(secret, str) else secret
            self.key = hashlib.sha256(b"cometmq-dashboard-session\0" + raw).digest()
        self.ttl = ttl
        self._revoked: dict[str, float] = {}

    def _mac(self, payload: bytes) -> bytes:
        return hmac.new(self.key, payload, hashlib.sha256).digest()

    def issue(self, user: User, now: float | None = None) -> tuple[str, Session]:
        now = float(int(time.time() if now is None else now))
        s = Session(user.name, secrets.token_urlsafe(16), now, float(int(now + self.ttl)), user.fingerprint)
        payload = json.dumps({"u": s.user, "s": s.sid, "i": int(s.issued), "e": int(s.expires),
                              "f": s.fingerprint}, separators=(",", ":")).encode()
        return f"{_b64(payload)}.{_b64(self._mac(payload))}", s

    def read(self, cookie: str | None, now: float | None = None) -> Session | None:
        """The session of a cookie: None when absent, forged, expired or revoked."""
        if not cookie or cookie.count(".") != 1 or len(cookie) > 4096:
            return None
        now = time.time() if now is None else now
        body, mac = cookie.split(".")
        try:
            payload, given = _unb64(body), _unb64(mac)
        except (ValueError, binascii.Error):
            return None
        if not hmac.compare_digest(self._mac(payload), given):
            return None
        try:
            obj = json.loads(payload)
            s = Session(str(obj["u"]), str(obj["s"]), float(obj["i"]), float(obj["e"]), str(obj["f"]))
        except (ValueError, KeyError, TypeError):
            return None
        if s.expires <= now or s.sid in self._revoked:
            return None
        return s

    def revoke(self, s: Session, now: float | None = None) -> None:
        now = time.time() if now is None else now
        for sid in [k for k, exp in self._revoked.items() if exp <= now]:
            del self._revoked[sid]
        self._revoked[s.sid] = s.expires

    def csrf_token(self, s: Session) -> str:
        return _b64(hmac.new(self.key, b"csrf\0" + s.sid.encode(), hashlib.sha256).digest())

    def csrf_ok(self, s: Session, given: str) -> bool:
        return bool(given) and hmac.compare_digest(self.csrf_token(s).encode(), given.encode())


class LoginThrottle:
    """Failed logins per client address: ``max_failures`` within ``window`` seconds lock the address out for
    ``lockout`` seconds, doubled at each further lock-out (at most ``window``). A success clears the address."""

    def __init__(self, max_failures: int = 5, window: float = 900.0, lockout: float = 30.0,
                 max_addresses: int = 10_000) -> None:
        self.max_failures = max_failures
        self.window = window
        self.lockout = lockout
        self.max_addresses = max_addresses
        #: address -> (failure times in the window, locked until, lock-outs so far)
        self._by_addr: dict[str, tuple[list[float], float, int]] = {}

    def retry_after(self, addr: str, now: float | None = None) -> float:
        """Seconds until ``addr`` may try again (0: now)."""
        now = time.monotonic() if now is None else now
        entry = self._by_addr.get(addr)
        return max(0.0, entry[1] - now) if entry is not None else 0.0

    def failed(self, addr: str, now: float | None = None) -> float:
        """Note a failure; the lock-out it starts, in seconds (0: none)."""
        now = time.monotonic() if now is None else now
        self._prune(now)
        times, until, locks = self._by_addr.get(addr, ([], 0.0, 0))
        times = [t for t in times if now - t < self.window] + [now]
        wait = 0.0
        if len(times) >= self.max_failures:
            wait = min(self.window, self.lockout * (2 ** locks))
            until, locks, times = now + wait, locks + 1, []
        self._by_addr[addr] = (times, until, locks)
        return wait

    def succeeded(self, addr: str) -> None:
        self._by_addr.pop(addr, None)

    def _prune(self, now: float) -> None:
        if len(self._by_addr) < self.max_addresses:
            return
        for addr in [a for a, (ts, until, _) in self._by_addr.items()
                     if until <= now and (not ts or now - ts[-1] >= self.window)]:
            del self._by_addr[addr]
        while len(self._by_addr) >= self.max_addresses:  # still full: the oldest entries go
            del self._by_addr[next(iter(self._by_addr))]


def _b64(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode("ascii")


def _unb64(s: str) -> bytes:
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))
