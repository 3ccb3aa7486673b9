"""Logging of the server commands (``cometmq namesrv|controller|broker|serve|proxy|cluster``).

Every command takes the same options (declared in ``cometmq.cli``, applied here: the server process, which runs
``cometmq.server_main``, holds neither typer nor rich):

- ``--log-level INFO,cometmq.broker.ha=DEBUG``: a level for everything, then per-logger overrides;
- ``--log-format text|json``: json writes one object per line: time, level, logger, message, exc;
- ``--log-file PATH`` with ``--log-max-bytes`` / ``--log-backups``: a rotating file instead of stderr.

A bad level or format is a usage error (exit code 2).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
DEFAULT_MAX_BYTES = 100 * 1024 * 1024
DEFAULT_BACKUPS = 5
_LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG", "NOTSET")


@dataclass(frozen=True)
class LogSpec:
    """What the options asked for; ``level_text`` is the ``--log-level`` value as given (child processes)."""

    level: str = "INFO"
    overrides: dict[str, str] = field(default_factory=dict)
    format: str = "text"
    file: Path | None = None
    max_bytes: int = DEFAULT_MAX_BYTES
    backups: int = DEFAULT_BACKUPS
    level_text: str = "INFO"


def _level(text: str) -> str:
    name = text.strip().upper()
    if name == "WARN":
        name = "WARNING"
    if name not in _LEVELS:
        raise ValueError(f"unknown level {text.strip()!r} (one of {', '.join(_LEVELS[:-1])})")
    return name


def parse_levels(text: str) -> tuple[str, dict[str, str]]:
    """``"INFO,cometmq.broker.ha=DEBUG"`` -> ``("INFO", {"cometmq.broker.ha": "DEBUG"})``. The global level may
    be left out (INFO) or come anywhere in the list; a level or logger name that cannot be used is a ValueError."""
    level = "INFO"
    overrides: dict[str, str] = {}
    seen_global = False
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "=" in part:
            name, _, value = part.partition("=")
            name = name.strip()
            if not name:
                raise ValueError(f"{part!r}: a logger name is missing before '='")
            overrides[name] = _level(value)
        else:
            if seen_global:
                raise ValueError(f"two global levels in {text!r}")
            level, seen_global = _level(part), True
    return level, overrides


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: time (ISO 8601, UTC, ms), level, logger, message, exc."""

    def format(self, record: logging.LogRecord) -> str:
        exc = None
        if record.exc_info:
            exc = self.formatException(record.exc_info)
        elif record.exc_text:
            exc = record.exc_text
        if record.stack_info:
            exc = f"{exc}\n{record.stack_info}" if exc else self.formatStack(record.stack_info)
        # (time, not datetime: a server does not load datetime for this)
        when = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(int(record.created))) + f".{int(record.msecs):03d}Z"
        return json.dumps({"time": when,
                           "level": record.levelname, "logger": record.name, "message": record.getMessage(),
                           "exc": exc}, ensure_ascii=False, default=str)


def handler_for(spec: LogSpec) -> logging.Handler:
    """The handler ``spec`` asks for, with its formatter: a rotating file, else stderr."""
    handler: logging.Handler
    if spec.file is not None:
        from logging.handlers import RotatingFileHandler  # only with --log-file: the module pulls pickle, socket…

        spec.file.parent.mkdir(parents=True, exist_ok=True)
        handler = RotatingFileHandler(spec.file, maxBytes=spec.max_bytes, backupCount=spec.backups, encoding="utf-8")
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if spec.format == "json" else logging.Formatter(TEXT_FORMAT))
    return handler


def configure(spec: LogSpec) -> None:
    """Log as ``spec`` asks: one handler on the root logger (any earlier one closed), the global level there, the
    per-logger levels on their loggers. (By hand rather than with ``logging.config``, which with what it imports
    costs a server about 1 MB.)"""
    handler = handler_for(spec)
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(spec.level)
    for name, level in spec.overrides.items():
        logging.getLogger(name).setLevel(level)
