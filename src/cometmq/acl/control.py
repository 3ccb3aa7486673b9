"""AccessControl: the one access check of both protocols, over an ACL file it reloads when the file changes.

``check(Attempt)`` runs RocketMQ's PlainPermissionManager.validate order: an address on the global allow-list
passes; else the access key must be known; an address on the account's own allow-list passes; else the signature
must match (``hmac.compare_digest``); then admin rights for admin codes, then the permission on every topic and
group the request touches. Protocols differ only in what they sign, so an Attempt carries a ``verify(secret)``
callback: remoting recomputes RocketMQ's request signature, gRPC the 5.x ``Authorization`` header's.

A refusal raises AccessDenied with RocketMQ's wording; ``refused()`` logs it once per (client host, reason) per
minute, so a misconfigured client retrying in a loop does not flood the log.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import stat
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from cometmq.acl.model import Account, AclConfig, AclConfigError, check_permission, parse_acl
from cometmq.acl.policy import TRACE_TOPIC, Need
from cometmq.common.atomic_file import write_atomic

log = logging.getLogger("cometmq.acl")

#: how often the ACL file's mtime is looked at
DEFAULT_RELOAD_INTERVAL_S = 3.0
#: an ACL change (mqadmin updateAclConfig & co.) starts from the file as it is: a file that changed since the last
#: poll is read again this often until two reads agree, at most SETTLE_READS times
SETTLE_GAP_S = 0.5
SETTLE_READS = 6
#: a refusal with the same (host, reason) is logged again after this long, with the count in between
LOG_EVERY_S = 60.0
_MAX_LOG_KEYS = 10_000
#: what is kept and logged of a refusal's reason: it quotes what the caller sent (an access key no account has)
REASON_LOG_CHARS = 200
#: lines about one host per LOG_EVERY_S: a caller whose every request is refused for another reason (a made-up
#: access key each time) is logged this often, then counted
LINES_PER_HOST = 20


class AccessDenied(Exception):
    """A refused request; ``str()`` is the remark the client gets."""


class NotAuthenticated(AccessDenied):
    """Refused before any permission was looked at: no credentials, an unknown access key, a bad signature."""


@dataclass(frozen=True, slots=True)
class Attempt:
    """One request to check. ``access_key`` None: the request carries no credentials."""

    remote_host: str
    access_key: str | None
    verify: Callable[[str], bool]
    code: int | str
    admin: bool
    needs: Sequence[Need] = ()


def host_of(address: str) -> str:
    """``host:port`` / ``[v6]:port`` / ``ipv4:h:p`` / ``ipv6:[h]:p`` (gRPC peers) -> the host."""
    for prefix in ("ipv4:", "ipv6:"):
        if address.startswith(prefix):
            address = address[len(prefix):]
    if address.startswith("["):
        return address[1:address.find("]")] if "]" in address else address
    if address.count(":") == 1:
        return address.rpartition(":")[0]
    return address


class AccessControl:
    """The ACL of one server (broker, nameserver or gRPC endpoint), read from ``path``.

    A missing file is an empty ACL (every request that needs credentials is refused, as in RocketMQ) and is
    picked up when it appears; a file that does not parse fails ``load()`` (startup) with the line and key, and
    on a reload is logged while the previous ACL stays in force.

    A changed file is put in force only once two polls in a row read the same mtime, size and content: an editor
    or ``cp`` writing the file in place leaves it half-written in between, and a truncated list of accounts still
    parses (RocketMQ's watcher reloads at the first change of the file's hash, half-written or not).
    """

    def __init__(self, path: str | Path, *, reload_interval_s: float = DEFAULT_RELOAD_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = Path(path)
        self.reload_interval_s = reload_interval_s
        self.config = AclConfig()
        self._stamp: tuple[int, int] | None = None
        #: a change seen at the last look and not yet in force: its (mtime, size) and the content's digest
        self._pending: tuple[tuple[int, int], bytes] | None = None
        self._clock = clock
        self._logged: dict[tuple[str, str], list[float]] = {}
        #: host -> [start of its current minute, lines logged in it, refusals held back past LINES_PER_HOST]
        self._host_lines: dict[str, list[float]] = {}
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def from_config(cls, config: AclConfig) -> AccessControl:
        """An ACL held in memory only (tests; the gRPC endpoint's ``--access-keys``): no file, no reload."""
        ac = cls(os.devnull)
        ac.config = config
        ac._stamp = (-1, -1)
        return ac

    # -- the file ---------------------------------------------------------------------------------------------
    def _file_stamp(self) -> tuple[int, int] | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def load(self) -> None:
        """Read the file now; AclConfigError if it does not parse (the ACL in force is unchanged then)."""
        stamp = self._file_stamp()
        if stamp is None:
            log.warning("ACL file %s does not exist: requests that need credentials are refused until it does",
                        self.path)
            self.config, self._stamp, self._pending = AclConfig(), None, None
            return
        self._apply(stamp, self._read())

    def _read(self) -> bytes:
        try:
            return self.path.read_bytes()
        except OSError as exc:
            raise AclConfigError(f"cannot read {self.path}: {exc}") from None

    def _apply(self, stamp: tuple[int, int], data: bytes) -> None:
        self._pending = None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise AclConfigError(f"{self.path} is not UTF-8 text (byte {exc.start}: {exc.reason})") from None
        self.config = parse_acl(text, str(self.path))
        self._stamp = stamp
        log.info("ACL loaded from %s: %d accounts, %d global allow-list patterns", self.path,
                 len(self.config.accounts), len(self.config.global_white))

    @property
    def settling(self) -> bool:
        """Whether the file changed at the last look and waits for one more read that agrees."""
        return self._pending is not None

    def reload_if_changed(self) -> bool:
        """Reload when the file's mtime or size changed and it reads the same as at the last call (a file still
        being written waits); True when a new ACL is in force."""
        if self.path == Path(os.devnull):
            return False
        stamp = self._file_stamp()
        if stamp == self._stamp:
            self._pending = None  # (changed and changed back)
            return False
        if stamp is None:
            log.warning("ACL file %s was removed; keeping the ACL last read from it", self.path)
            self._stamp, self._pending = None, None
            return False
        try:
            data = self._read()
            digest = hashlib.sha256(data).digest()
            pending = self._pending
            if pending is None or pending[0] != stamp or pending[1] != digest or self._file_stamp() != stamp:
                self._pending = (stamp, digest)  # put in force at the next look if it is still this
                return False
            self._apply(stamp, data)
        except AclConfigError as exc:
            self._stamp, self._pending = stamp, None  # one error per bad version of the file, not one per poll
            log.error("ACL file changed but cannot be used (the previous ACL stays in force): %s", exc)
            return False
        return True

    async def reload_settled(self, gap_s: float = SETTLE_GAP_S, reads: int = SETTLE_READS) -> None:
        """Put a changed file in force now rather than at the next polls (an ACL change starts from the file as
        it is): read it again every ``gap_s`` until two reads agree; AclConfigError if it is still changing after
        ``reads`` reads (the ACL in force is unchanged then)."""
        self.reload_if_changed()
        for _ in range(reads - 1):
            if not self.settling:
                return
            await asyncio.sleep(gap_s)
            self.reload_if_changed()
        if self.settling:
            raise AclConfigError(f"{self.path} is still being written (it changed at each of {reads} reads "
                                 f"{gap_s} s apart); try again once it is complete")

    def start(self) -> None:
        """Poll the file every ``reload_interval_s`` (on the running loop) until ``stop()``."""
        if self._task is None and self.path != Path(os.devnull):
            self._task = asyncio.get_running_loop().create_task(self._watch(), name="acl-reload")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.reload_interval_s)
            try:
                self.reload_if_changed()
            except Exception:  # never let the watcher die
                log.exception("ACL reload of %s failed", self.path)

    def save(self, config: AclConfig) -> None:
        """Write ``config`` to the file (atomically, dataVersion bumped) and put it in force. The file holds every
        secret key: it keeps its permission bits (the new file renamed over it gets them before any byte), and one
        created here is 0600."""
        config = replace(config, counter=config.counter + 1, timestamp=int(time.time() * 1000))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            mode = stat.S_IMODE(self.path.stat().st_mode)
        except FileNotFoundError:
            mode = 0o600
        write_atomic(self.path, config.dumps().encode("utf-8"), mode=mode)
        self.config = config
        self._stamp, self._pending = self._file_stamp(), None

    # -- the check ----------------------------------------------------------------------------------------------
    def globally_allowed(self, host: str) -> bool:
        """Whether ``host`` is on the global allow-list (no credentials needed at all)."""
        return any(pattern.match(host) for pattern in self.config.global_white)

    def check(self, attempt: Attempt) -> Account | None:
        """The account the request was made with (None when an allow-list let it in without one); AccessDenied
        when refused."""
        config = self.config
        host = attempt.remote_host
        for pattern in config.global_white:
            if pattern.match(host):
                return None
        if not attempt.access_key:
            raise NotAuthenticated("No accessKey is configured")
        account = config.accounts.get(attempt.access_key)
        if account is None:
            raise NotAuthenticated(f"No acl config for {attempt.access_key}")
        if account.white_remote_address is not None and account.white_remote_address.match(host):
            return account
        if not attempt.verify(account.secret_key):
            raise NotAuthenticated(f"Check signature failed for accessKey={account.access_key}")
        needs = [n for n in attempt.needs if not _is_trace_send(n)]
        if len(needs) < len(attempt.needs) and not needs:
            return account
        if attempt.admin and not account.admin:
            raise AccessDenied(f"Need admin permission for request code={attempt.code}, "
                               f"but accessKey={account.access_key} is not")
        if account.admin and not account.topic_perms and not account.group_perms:
            return account
        for need in needs:
            if not account.allows(need.resource, need.is_group, need.perm):
                raise AccessDenied(f"No permission for {need.describe()} "
                                   f"(accessKey={account.access_key}, needs {_perm_word(need.perm)})")
        return account

    def refused(self, host: str, reason: str, what: str) -> None:
        """Log a refusal once per (host, reason) per LOG_EVERY_S, and at most LINES_PER_HOST lines per host in
        that time, counting the ones not logged; a reason is cut to REASON_LOG_CHARS (it quotes the caller)."""
        if len(reason) > REASON_LOG_CHARS:
            reason = f"{reason[:REASON_LOG_CHARS]}... ({len(reason)} characters)"
        key = (host, reason)
        now = self._clock()
        entry = self._logged.get(key)
        if entry is not None and now - entry[0] < LOG_EVERY_S:
            entry[1] += 1
            return
        lines = self._host_lines.get(host)
        held = 0
        if lines is None or now - lines[0] >= LOG_EVERY_S:
            held = int(lines[2]) if lines is not None else 0
            if len(self._host_lines) >= _MAX_LOG_KEYS:
                self._host_lines.clear()
            lines = self._host_lines[host] = [now, 0, 0]
        if lines[1] >= LINES_PER_HOST:
            lines[2] += 1
            return
        lines[1] += 1
        if len(self._logged) >= _MAX_LOG_KEYS:
            self._logged.clear()
        more = f" ({int(entry[1])} more refusals like it since it was last logged)" if entry and entry[1] else ""
        if held:
            more += f" ({held} refusals of {host} for other reasons were not logged in the minute before)"
        self._logged[key] = [now, 0]
        log.warning("refused %s from %s: %s%s", what, host, reason, more)


def _is_trace_send(need: Need) -> bool:
    """Sending traces is always allowed, but only lets that need through, not the others of the same request."""
    return need.resource == TRACE_TOPIC and not need.is_group and bool(need.perm & 4)


def _perm_word(perm: int) -> str:
    return {2: "PUB or SUB", 4: "PUB", 8: "SUB"}.get(perm, str(perm))


def accounts_config(pairs: Iterable[tuple[str, str]]) -> AclConfig:
    """An ACL of admin accounts with every permission: what ``--access-keys`` (authentication only) means."""
    return AclConfig({ak: Account(ak, sk, admin=True) for ak, sk in pairs})


__all__ = ["AccessControl", "AccessDenied", "Attempt", "NotAuthenticated", "accounts_config", "check_permission",
           "host_of"]
