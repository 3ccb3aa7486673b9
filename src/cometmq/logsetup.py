"""Logging of the server commands (``cometmq namesrv|controller|broker|serve|proxy|cluster``).

Every command takes the same options, added by the ``log_options`` decorator:

- ``--log-level INFO,cometmq.broker.ha=DEBUG``: a level for everything, then per-logger overrides;
- ``--log-format text|json``: json writes one object per line: time, level, logger, message, exc;
- ``--log-file PATH`` with ``--log-max-bytes`` / ``--log-backups``: a rotating file instead of stderr.

A bad level or format is a usage error (exit code 2). The configuration is applied with ``logging.config``.
"""

from __future__ import annotations

import datetime
import functools
import inspect
import json
import logging
import logging.config
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

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
        when = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        return json.dumps({"time": when.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                           "level": record.levelname, "logger": record.name, "message": record.getMessage(),
                           "exc": exc}, ensure_ascii=False, default=str)


def dict_config(spec: LogSpec) -> dict[str, Any]:
    """The ``logging.config.dictConfig`` schema for ``spec``."""
    formatter: dict[str, Any] = ({"()": f"{__name__}.JsonFormatter"} if spec.format == "json"
                                 else {"format": TEXT_FORMAT})
    handler: dict[str, Any]
    if spec.file is not None:
        handler = {"class": "logging.handlers.RotatingFileHandler", "filename": str(spec.file),
                   "maxBytes": spec.max_bytes, "backupCount": spec.backups, "encoding": "utf-8"}
    else:
        handler = {"class": "logging.StreamHandler", "stream": "ext://sys.stderr"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"main": formatter},
        "handlers": {"main": {**handler, "formatter": "main"}},
        "root": {"level": spec.level, "handlers": ["main"]},
        "loggers": {name: {"level": level} for name, level in spec.overrides.items()},
    }


def configure(spec: LogSpec) -> None:
    if spec.file is not None:
        spec.file.parent.mkdir(parents=True, exist_ok=True)
    logging.config.dictConfig(dict_config(spec))


# -- the command-line options ------------------------------------------------------------------------------------
def _check_levels(value: str) -> str:
    try:
        parse_levels(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    return value


def _check_format(value: str) -> str:
    if value.strip().lower() not in FORMATS:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(FORMATS)}")
    return value.strip().lower()


_OPTIONS: dict[str, tuple[Any, Any]] = {
    "log_level": (Annotated[str, typer.Option(
        help="logging level, then per-logger levels: 'INFO,cometmq.broker.ha=DEBUG'", callback=_check_levels,
        envvar="COMETMQ_LOG_LEVEL", rich_help_panel="Logging")], "INFO"),
    "log_format": (Annotated[str, typer.Option(
        help="text, or json (one object per line: time, level, logger, message, exc)", callback=_check_format,
        envvar="COMETMQ_LOG_FORMAT", rich_help_panel="Logging")], "text"),
    "log_file": (Annotated[Path | None, typer.Option(
        help="write the log to this file (rotated) instead of stderr", show_default=False,
        rich_help_panel="Logging")], None),
    "log_max_bytes": (Annotated[int, typer.Option(
        min=1, help="rotate --log-file when it reaches this size", rich_help_panel="Logging")], DEFAULT_MAX_BYTES),
    "log_backups": (Annotated[int, typer.Option(
        min=0, help="rotated files of --log-file to keep (FILE.1 … FILE.N)", rich_help_panel="Logging")],
        DEFAULT_BACKUPS),
}

F = TypeVar("F", bound=Callable[..., Any])


def log_options(fn: F) -> F:
    """Add the logging options to a typer command and configure logging before it runs. A command that wants
    what was asked (``cometmq cluster`` hands the level to its children) declares a ``log_spec`` parameter."""
    sig = inspect.signature(fn, eval_str=True)
    wants_spec = "log_spec" in sig.parameters
    params = [p for p in sig.parameters.values() if p.name != "log_spec"]
    params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)
               for name, (annotation, default) in _OPTIONS.items()]

    @functools.wraps(fn)
    def command(*args: Any, log_level: str, log_format: str, log_file: Path | None, log_max_bytes: int,
                log_backups: int, **kwargs: Any) -> Any:
        level, overrides = parse_levels(log_level)
        spec = LogSpec(level, overrides, log_format, log_file, log_max_bytes, log_backups, log_level)
        try:
            configure(spec)
        except (ValueError, OSError) as exc:  # the file cannot be opened
            raise typer.BadParameter(f"{log_file}: {exc.__cause__ or exc}", param_hint="--log-file") from None
        if wants_spec:
            kwargs["log_spec"] = spec
        return fn(*args, **kwargs)

    command.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    command.__annotations__ = {**{p.name: p.annotation for p in params}, "return": sig.return_annotation}
    return command  # type: ignore[return-value]
