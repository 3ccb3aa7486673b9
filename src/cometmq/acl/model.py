"""The access model: RocketMQ's ACL 1.0 (``plain_acl.yml``): accounts with an access key and a secret key, an
optional address allow-list per account, admin rights, a default permission for topics and one for groups, and a
permission per named topic and group; plus addresses allowed without any credentials (``globalWhiteRemoteAddresses``).

Permissions are RocketMQ's bits: DENY 1, ANY 2 (needed by requests either PUB or SUB satisfies), PUB 4, SUB 8; an
owned permission with DENY set grants nothing (``check_permission``).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cometmq.acl.yamlite import Document, YamlError, dumps, loads

DENY = 1
ANY = 2
PUB = 4
SUB = 8

PERM_NAMES = {"DENY": DENY, "PUB": PUB, "SUB": SUB, "PUB|SUB": PUB | SUB, "SUB|PUB": PUB | SUB}
#: RocketMQ's AclConstants.ACCESS_KEY_MIN_LENGTH / SECRET_KEY_MIN_LENGTH: keys must be longer than this
KEY_MIN_LENGTH = 6

#: the file's keys, as RocketMQ names them
TOP_KEYS = ("globalWhiteRemoteAddresses", "accounts", "dataVersion")
ACCOUNT_KEYS = ("accessKey", "secretKey", "whiteRemoteAddress", "admin", "defaultTopicPerm", "defaultGroupPerm",
                "topicPerms", "groupPerms")


class AclConfigError(ValueError):
    """A bad ACL file or a bad account; the message names the file, line and key when known."""


def perm_name(perm: int) -> str:
    if perm & DENY:
        return "DENY"
    return {PUB: "PUB", SUB: "SUB", PUB | SUB: "PUB|SUB"}.get(perm & (PUB | SUB), "DENY")


def parse_perm(text: object) -> int:
    """``PUB``, ``SUB``, ``PUB|SUB`` (``SUB|PUB``), ``DENY``; ValueError for anything else (RocketMQ reads an unknown
    word as DENY; a typo here should not silently lock a user out)."""
    if not isinstance(text, str) or text.strip().upper() not in PERM_NAMES:
        raise ValueError(f"{text!r} is not a permission (PUB, SUB, PUB|SUB or DENY)")
    return PERM_NAMES[text.strip().upper()]


def check_permission(needed: int, owned: int) -> bool:
    """RocketMQ's Permission.checkPermission."""
    if owned & DENY:
        return False
    if needed & ANY:
        return bool(owned & (PUB | SUB))
    return bool(needed & owned)


# -- address patterns (RocketMQ's RemoteAddressStrategyFactory) --------------------------------------------------
_OCTET = re.compile(r"\*|\d{1,3}(?:-\d{1,3})?")


@dataclass(frozen=True)
class AddressPattern:
    """``*`` (any address), one address, ``a,b,c`` (a list of addresses), ``192.168.1.{1,2,3}`` (a list on the
    last part), ``192.168.0.*`` / ``192.168.*.*`` / ``192.168.1.10-20`` (IPv4 ranges: the first ``*`` or range
    part, then only ``*``). Blank matches nothing."""

    text: str
    any: bool = False
    exact: frozenset[str] = frozenset()
    #: per IPv4 octet: (low, high)
    ranges: tuple[tuple[int, int], ...] = ()

    @classmethod
    def parse(cls, text: object) -> AddressPattern | None:
        if text is None:
            return None
        s = str(text).strip()
        if not s:
            return None
        if s in ("*", "*.*.*.*", "*:*:*:*:*:*:*:*"):
            return cls(s, any=True)
        if s.endswith("}"):
            head, brace, tail = s.partition("{")
            if not brace or not head or head[-1] not in ".:":
                raise ValueError(f"{s!r}: a {{a,b}} list must be the last part of the address")
            return cls(s, exact=frozenset(_address(head + item.strip()) for item in tail[:-1].split(",")))
        if "," in s:
            return cls(s, exact=frozenset(_address(item.strip()) for item in s.split(",")))
        if "*" in s or ("-" in s and ":" not in s):
            parts = s.split(".")
            if len(parts) != 4 or not all(_OCTET.fullmatch(p.strip()) for p in parts):
                raise ValueError(f"{s!r} is not an IPv4 range (like 192.168.0.*, 192.168.*.*, 10.0.0.1-100)")
            ranges: list[tuple[int, int]] = []
            wild = False
            for p in (p.strip() for p in parts):
                if wild and p != "*":
                    raise ValueError(f"{s!r}: after a '*' or a range only '*' may follow")
                if p == "*":
                    ranges.append((0, 255))
                    wild = True
                elif "-" in p:
                    lo, hi = (int(x) for x in p.split("-"))
                    if not 0 <= lo <= hi <= 255:
                        raise ValueError(f"{s!r}: bad range {p}")
                    ranges.append((lo, hi))
                    wild = True
                else:
                    n = int(p)
                    if n > 255:
                        raise ValueError(f"{s!r}: {p} is not 0..255")
                    ranges.append((n, n))
            return cls(s, ranges=tuple(ranges))
        return cls(s, exact=frozenset({_address(s)}))

    def match(self, host: str) -> bool:
        if self.any:
            return True
        try:
            addr = ipaddress.ip_address(host.strip("[]").split("%")[0])
        except ValueError:
            return False
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        if self.exact:
            return str(addr) in self.exact
        if self.ranges and isinstance(addr, ipaddress.IPv4Address):
            return all(lo <= int(o) <= hi for o, (lo, hi) in zip(str(addr).split("."), self.ranges, strict=True))
        return False


def _address(text: str) -> str:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise ValueError(f"{text!r} is not an IP address") from None


# -- accounts and the file ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Account:
    access_key: str
    secret_key: str
    white_remote_address: AddressPattern | None = None
    admin: bool = False
    default_topic_perm: int = DENY
    default_group_perm: int = DENY
    topic_perms: Mapping[str, int] = field(default_factory=dict)
    group_perms: Mapping[str, int] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"Account(access_key={self.access_key!r}, admin={self.admin})"

    def allows(self, resource: str, is_group: bool, needed: int) -> bool:
        """The permission named for ``resource`` decides; the default one only when none is named (RocketMQ 4.x's
        PlainPermissionChecker: an explicit ``topicA=DENY`` is not overridden by ``defaultTopicPerm: PUB``)."""
        owned = (self.group_perms if is_group else self.topic_perms).get(resource)
        if owned is None:
            owned = self.default_group_perm if is_group else self.default_topic_perm
        return check_permission(needed, owned)

    def to_yaml(self) -> dict[str, Any]:
        out: dict[str, Any] = {"accessKey": self.access_key, "secretKey": self.secret_key,
                               "whiteRemoteAddress": self.white_remote_address.text if self.white_remote_address
                               else "", "admin": self.admin,
                               "defaultTopicPerm": perm_name(self.default_topic_perm),
                               "defaultGroupPerm": perm_name(self.default_group_perm)}
        if self.topic_perms:
            out["topicPerms"] = [f"{k}={perm_name(v)}" for k, v in self.topic_perms.items()]
        if self.group_perms:
            out["groupPerms"] = [f"{k}={perm_name(v)}" for k, v in self.group_perms.items()]
        return out


@dataclass(frozen=True)
class AclConfig:
    accounts: Mapping[str, Account] = field(default_factory=dict)
    global_white: tuple[AddressPattern, ...] = ()
    #: RocketMQ's dataVersion of the file: bumped on every change made through the admin requests
    counter: int = 0
    timestamp: int = 0

    def to_yaml(self) -> dict[str, Any]:
        return {"globalWhiteRemoteAddresses": [p.text for p in self.global_white],
                "accounts": [a.to_yaml() for a in self.accounts.values()],
                "dataVersion": [{"counter": self.counter, "timestamp": self.timestamp}]}

    def dumps(self) -> str:
        return "# cometmq ACL (RocketMQ plain_acl.yml); see docs/security.md\n" + dumps(self.to_yaml())


def _string(value: object, what: str) -> str:
    if isinstance(value, bool) or value is None or isinstance(value, (list, dict)):
        raise ValueError(f"{what} must be a string, got {value!r}")
    return str(value)


def _bool_value(value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError(f"admin must be true or false, got {value!r}")


def _resource_perms(items: object, kind: str) -> dict[str, int]:
    """``["topicA=PUB", "topicB=PUB|SUB"]`` (a comma-separated string too, as the admin request carries it)."""
    if items is None:
        return {}
    if isinstance(items, str):
        items = [s for s in items.split(",") if s.strip()]
    if not isinstance(items, list):
        raise ValueError(f"{kind}Perms must be a list of name=PERM, got {items!r}")
    out: dict[str, int] = {}
    for item in items:
        name, eq, perm = str(item).partition("=")
        if not eq or not name.strip():
            raise ValueError(f"{item!r} is not {kind}=PERM")
        out[name.strip()] = parse_perm(perm)
    return out


def account_from_yaml(raw: Mapping[str, Any]) -> Account:
    """One ``accounts`` item; ValueError naming the key on a bad value (AclConfigError for the file wraps it)."""
    unknown = sorted(set(raw) - set(ACCOUNT_KEYS) - {"resourcePerms", "namespacePerms"})
    if unknown:
        raise _KeyError(unknown[0], f"unknown key {unknown[0]!r} (known: {', '.join(ACCOUNT_KEYS)})")
    for key in ("resourcePerms", "namespacePerms"):
        if raw.get(key):
            raise _KeyError(key, f"{key} (RocketMQ's namespace extension) is not supported")
    values: dict[str, Any] = {}
    for key, conv in (("accessKey", lambda v: _string(v, "accessKey")),
                      ("secretKey", lambda v: _string(v, "secretKey")),
                      ("whiteRemoteAddress", AddressPattern.parse),
                      ("admin", lambda v: False if v is None else _bool_value(v)),
                      ("defaultTopicPerm", lambda v: DENY if v is None else parse_perm(v)),
                      ("defaultGroupPerm", lambda v: DENY if v is None else parse_perm(v)),
                      ("topicPerms", lambda v: _resource_perms(v, "topic")),
                      ("groupPerms", lambda v: _resource_perms(v, "group"))):
        try:
            values[key] = conv(raw.get(key))
        except ValueError as exc:
            raise _KeyError(key, str(exc)) from None
    for key in ("accessKey", "secretKey"):
        if len(values[key]) <= KEY_MIN_LENGTH:
            raise _KeyError(key, f"{key} must be longer than {KEY_MIN_LENGTH} characters")
    return Account(values["accessKey"], values["secretKey"], values["whiteRemoteAddress"], values["admin"],
                   values["defaultTopicPerm"], values["defaultGroupPerm"], values["topicPerms"],
                   values["groupPerms"])


class _KeyError(ValueError):
    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def parse_acl(text: str, source: str = "plain_acl.yml") -> AclConfig:
    """Read a plain_acl.yml; AclConfigError names the file, the line and the key of the first problem."""
    try:
        doc = loads(text)
    except YamlError as exc:
        raise AclConfigError(f"{source}: {exc}") from None
    return acl_from_document(doc, source)


def acl_from_document(doc: Document, source: str) -> AclConfig:
    def err(path: tuple[str | int, ...], message: str) -> AclConfigError:
        line = doc.line_of(path)
        where = "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else p) for i, p in enumerate(path))
        return AclConfigError(f"{source}{f' line {line}' if line else ''} ({where or 'top level'}): {message}")

    root = doc.value
    if root is None:
        return AclConfig()
    if not isinstance(root, dict):
        raise err((), "the file must be a mapping (globalWhiteRemoteAddresses, accounts)")
    for key in root:
        if key not in TOP_KEYS:
            raise err((key,), f"unknown key {key!r} (known: {', '.join(TOP_KEYS)})")
    white: list[AddressPattern] = []
    raw_white = root.get("globalWhiteRemoteAddresses") or []
    if not isinstance(raw_white, list):
        raise err(("globalWhiteRemoteAddresses",), "must be a list of address patterns")
    for i, item in enumerate(raw_white):
        try:
            pattern = AddressPattern.parse(item)
        except ValueError as exc:
            raise err(("globalWhiteRemoteAddresses", i), str(exc)) from None
        if pattern is not None:
            white.append(pattern)
    accounts: dict[str, Account] = {}
    raw_accounts = root.get("accounts") or []
    if not isinstance(raw_accounts, list):
        raise err(("accounts",), "must be a list of accounts ('- accessKey: ...')")
    for i, raw in enumerate(raw_accounts):
        if not isinstance(raw, dict):
            raise err(("accounts", i), "an account is a mapping (accessKey, secretKey, ...)")
        try:
            account = account_from_yaml(raw)
        except _KeyError as exc:
            raise err(("accounts", i, exc.key), str(exc)) from None
        if account.access_key in accounts:
            raise err(("accounts", i, "accessKey"), f"accessKey {account.access_key!r} is defined twice")
        accounts[account.access_key] = account
    counter = timestamp = 0
    version = root.get("dataVersion")
    if isinstance(version, list) and version and isinstance(version[0], dict):
        counter = version[0].get("counter") or 0
        timestamp = version[0].get("timestamp") or 0
        if not isinstance(counter, int) or not isinstance(timestamp, int):
            raise err(("dataVersion", 0), "counter and timestamp must be integers")
    elif version is not None:
        raise err(("dataVersion",), "must be a list with one '- counter: N, timestamp: MS' item")
    return AclConfig(accounts, tuple(white), counter, timestamp)
