"""The ACL file the ACL tests share: one admin account and one user account (``plain_acl.yml``, RocketMQ's keys)."""

from __future__ import annotations


def admin_and_user(admin: tuple[str, str], user: tuple[str, str], *, topic_perms: dict[str, str] | None = None,
                   default_topic: str = "DENY", default_group: str = "SUB") -> str:
    """A plain_acl.yml text: ``admin`` (access key, secret key) an admin; ``user`` not, with these defaults and
    per-topic permissions (topic -> PUB, SUB, PUB|SUB or DENY)."""
    lines = ["accounts:",
             f"  - accessKey: {admin[0]}", f"    secretKey: {admin[1]}", "    admin: true",
             f"  - accessKey: {user[0]}", f"    secretKey: {user[1]}", "    admin: false",
             f"    defaultTopicPerm: {default_topic}", f"    defaultGroupPerm: {default_group}"]
    if topic_perms:
        lines.append("    topicPerms:")
        lines += [f"      - {topic}={perm}" for topic, perm in topic_perms.items()]
    return "\n".join(lines) + "\n"


def one_user(user: tuple[str, str], *, topic_perms: dict[str, str], group_perms: dict[str, str]) -> str:
    """A plain_acl.yml text of one account that is not an admin, denied every topic and group but these."""
    lines = ["accounts:", f"  - accessKey: {user[0]}", f"    secretKey: {user[1]}", "    defaultTopicPerm: DENY",
             "    defaultGroupPerm: DENY", "    topicPerms:"]
    lines += [f"      - {topic}={perm}" for topic, perm in topic_perms.items()]
    lines.append("    groupPerms:")
    lines += [f"      - {group}={perm}" for group, perm in group_perms.items()]
    return "\n".join(lines) + "\n"
