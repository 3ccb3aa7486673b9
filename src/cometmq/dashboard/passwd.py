"""``python -m cometmq.dashboard.passwd [NAME] [--admin]``: ask for a password twice and print the dashboard
users-file line with its scrypt hash (docs/dashboard.md, "Login")."""

from __future__ import annotations

import getpass
import sys

from cometmq.dashboard.auth import hash_password


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    admin = "--admin" in args
    names = [a for a in args if not a.startswith("-")]
    name = names[0] if names else "admin"
    password = getpass.getpass(f"password for {name}: ")
    if password != getpass.getpass("again: "):
        raise SystemExit("the passwords differ")
    if not password:
        raise SystemExit("an empty password is not allowed")
    print(f"{name}={hash_password(password)}{',1' if admin else ''}")


if __name__ == "__main__":
    main()
