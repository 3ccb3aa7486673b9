"""The commands' logging (issue [13]): levels with per-logger overrides, text or JSON lines, a rotating file,
bad values as usage errors; and the broker's per-interval stats line."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from logging.handlers import RotatingFileHandler
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cometmq.broker.stats_log import StatsLog, Totals
from cometmq.logsetup import JsonFormatter, LogSpec, handler_for, parse_levels

COMMANDS = ["namesrv", "controller", "broker", "serve", "proxy", "cluster"]


def test_levels_parse_with_per_logger_overrides() -> None:
    assert parse_levels("INFO") == ("INFO", {})
    assert parse_levels("debug") == ("DEBUG", {})
    assert parse_levels("warn,cometmq.broker.ha=DEBUG, cometmq.net = error") == (
        "WARNING", {"cometmq.broker.ha": "DEBUG", "cometmq.net": "ERROR"})
    assert parse_levels("cometmq.store=DEBUG") == ("INFO", {"cometmq.store": "DEBUG"})
    for bad in ("LOUD", "INFO,cometmq=LOUD", "INFO,DEBUG", "=DEBUG"):
        with pytest.raises(ValueError):
            parse_levels(bad)


def test_json_lines_carry_time_level_logger_message_exc() -> None:
    fmt = JsonFormatter()
    record = logging.LogRecord("cometmq.x", logging.WARNING, __file__, 1, "a %s\nline", ("two",), None)
    out = json.loads(fmt.format(record))
    assert out["level"] == "WARNING" and out["logger"] == "cometmq.x" and out["message"] == "a two\nline"
    assert out["exc"] is None and out["time"].endswith("Z")
    record.created, record.msecs = 1732700000.1239, 123.0  # as LogRecord sets them
    assert json.loads(fmt.format(record))["time"] == "2024-11-27T09:33:20.123Z"  # ISO 8601, UTC, milliseconds
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    line = fmt.format(record)
    assert "\n" not in line
    assert "RuntimeError: boom" in json.loads(line)["exc"]


def test_the_handler_is_the_rotating_file(tmp_path: Path) -> None:
    handler = handler_for(LogSpec("WARNING", {"cometmq.broker.ha": "DEBUG"}, "json", tmp_path / "b.log", 1000, 3))
    try:
        assert isinstance(handler, RotatingFileHandler) and isinstance(handler.formatter, JsonFormatter)
        assert (handler.maxBytes, handler.backupCount) == (1000, 3)
    finally:
        handler.close()
    assert isinstance(handler_for(LogSpec()), logging.StreamHandler)


def test_the_file_rotates(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "b.log"
    code = textwrap.dedent(f"""
        import logging
        from pathlib import Path
        from cometmq.logsetup import LogSpec, configure
        configure(LogSpec("INFO", {{"noisy": "ERROR"}}, "json", Path({str(log)!r}), 2000, 2))
        for i in range(200):
            logging.getLogger("cometmq.t").info("line %d", i)
            logging.getLogger("noisy").info("hidden")
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    files = sorted(p.name for p in log.parent.iterdir())
    assert files == ["b.log", "b.log.1", "b.log.2"]
    lines = [json.loads(line) for p in log.parent.iterdir() for line in p.read_text().splitlines()]
    assert all(entry["logger"] == "cometmq.t" for entry in lines)
    assert all(p.stat().st_size <= 2000 for p in log.parent.iterdir())


@pytest.mark.parametrize("command", COMMANDS)
def test_a_bad_level_or_format_is_a_usage_error(command: str, tmp_path: Path) -> None:
    from cometmq.cli import app

    runner = CliRunner()
    extra = ["--data", str(tmp_path)] if command in ("controller", "cluster") else []
    out = runner.invoke(app, [command, *extra, "--log-level", "INFO,cometmq.net=LOUD"])
    assert out.exit_code == 2, out.output
    assert "--log-level" in out.output and "LOUD" in out.output
    out = runner.invoke(app, [command, *extra, "--log-format", "xml"])
    assert out.exit_code == 2, out.output
    assert "--log-format" in out.output
    assert "--log-max-bytes" in runner.invoke(app, [command, "--help"]).output


def test_stats_line_rates_and_totals() -> None:
    now = [100.0]
    totals = [Totals(50, 10)]
    stats = StatsLog("b1", 60, lambda: totals[0], lambda: {"topics": 3}, clock=lambda: now[0])
    stats._origin = stats._last = totals[0]
    stats._last_at = now[0]
    now[0], totals[0] = 160.0, Totals(50 + 600, 10 + 120)
    assert stats.line() == "[BROKER] b1 putTps 10.0 getTps 2.0 putTotal 600 getTotal 120 topics 3"
    now[0] = 220.0
    assert stats.line().startswith("[BROKER] b1 putTps 0.0 getTps 0.0 putTotal 600 getTotal 120")
