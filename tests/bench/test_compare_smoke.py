"""bench/compare: the report on fixture results, argument checks, and one tiny cometmq-only session.

The peers (Redis, NATS, RabbitMQ) are not installed or run here; ``bench/compare --quick`` does that.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from compare_lib import report
from compare_lib.__main__ import main
from compare_lib.run import Mode, plan, run_all


def _rows() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for rep, (c, r, n) in enumerate([(50_000, 100_000, 40_000), (60_000, 80_000, 30_000), (40_000, 90_000, 20_000)]):
        rows += [{"system": "cometmq", "repeat": rep + 1, "workload": "produce_100b", "msgs_per_s": c},
                 {"system": "redis", "repeat": rep + 1, "workload": "produce_100b", "msgs_per_s": r},
                 {"system": "nats", "repeat": rep + 1, "workload": "produce_100b", "msgs_per_s": n},
                 {"system": "cometmq", "repeat": rep + 1, "workload": "latency", "median_ms": 0.5 + rep / 10},
                 {"system": "redis", "repeat": rep + 1, "workload": "latency", "median_ms": 1.0},
                 {"system": "redis", "repeat": rep + 1, "workload": "acked_1_nofsync", "msgs_per_s": 1000},
                 {"system": "cometmq", "repeat": rep + 1, "workload": "acked_1", "msgs_per_s": 2000}]
    rows.append({"system": "nats", "repeat": 3, "workload": "latency", "error": "TimeoutError: boom"})
    return rows


def _result(rows: list[dict[str, Any]]) -> dict[str, Any]:
    mode = Mode("quick", 3, 1.0, 10, 30_000, 10, 2.0, 1.0, 10)
    return {"meta": {"started": "2026-01-01 00:00", "duration_s": 12.0, "mode": report_mode(mode),
                     "json": "x.json", "versions": {"redis": "7"}, "server_config": {"redis": "aof"},
                     "client_settings": {"redis": "pipelines"}, "skipped": {"rabbitmq": "not installed"}},
            "runs": rows, "summary": report.summarize(rows)}


def report_mode(mode: Mode) -> dict[str, Any]:
    from compare_lib.run import mode_dict

    return mode_dict(mode)


def test_summary_is_median_min_max_and_skips_failed_rows() -> None:
    s = report.summarize(_rows())
    assert s["produce_100b"]["cometmq"]["msgs_per_s"] == {"median": 50_000, "min": 40_000, "max": 60_000, "n": 3}
    assert "nats" not in s.get("latency", {})


def test_ratio_table_ratios_and_direction() -> None:
    table = report.ratio_table(report.summarize(_rows()), 30_000)
    produce = next(line for line in table.splitlines() if line.startswith("| produce 100 B"))
    # cometmq 50k vs Redis 90k -> 0.56 (a loss, not bold); vs NATS 30k -> 1.67 (a win, bold)
    assert "| 0.56 |" in produce and "**1.67**" in produce
    latency = next(line for line in table.splitlines() if line.startswith("| latency, idle"))
    assert "**0.60**" in latency  # lower is better: 0.6 ms vs 1.0 ms is a win
    acked = next(line for line in table.splitlines() if "no fsync per ack" in line and "1 producer" in line)
    assert "**2.00**" in acked  # Redis's figure comes from its everysec run


def test_fsync_rows_take_nats_from_its_sync_always_server() -> None:
    """NATS's figure in an fsync-per-ack row is the nats-sync server's (sync_interval: always), never the default
    server's under that label: a dash when nats-sync did not run."""
    rows = [{"system": "cometmq-sync", "repeat": 1, "workload": "acked_1", "msgs_per_s": 3000},
            {"system": "nats", "repeat": 1, "workload": "acked_1", "msgs_per_s": 9000}]

    def fsync_row(rows: list[dict[str, Any]]) -> list[str]:
        table = report.ratio_table(report.summarize(rows), 30_000, peers=("nats",))
        line = next(line for line in table.splitlines() if "fsync per ack" in line and "no fsync" not in line
                    and "1 producer" in line)
        return [c.strip() for c in line.strip("|").split("|")]

    assert fsync_row(rows)[1:] == ["3,000", report.DASH, report.DASH]
    rows.append({"system": "nats-sync", "repeat": 1, "workload": "acked_1", "msgs_per_s": 2000})
    assert fsync_row(rows)[1:] == ["3,000", "2,000", "**1.50**"]


def test_docs_block_is_replaced_not_duplicated(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n## Store\n\nkeep me\n", encoding="utf-8")
    result = _result(_rows())
    report.update_docs(doc, report.markdown_block(result, "img/"))
    first = doc.read_text(encoding="utf-8")
    assert "keep me" in first and first.count(report.SECTION) == 1 and first.count(report.BEGIN) == 1
    assert "nats r3 latency: TimeoutError: boom" in first and "rabbitmq (not installed)" in first
    doc.write_text(first + "\n### hand-written analysis\n", encoding="utf-8")
    rows = _rows()
    rows[0]["msgs_per_s"] = 1  # a different result must show up in place of the old one
    report.update_docs(doc, report.markdown_block(_result(rows), "img/"))
    second = doc.read_text(encoding="utf-8")
    assert second.count(report.BEGIN) == 1 and second.count(report.END) == 1
    assert "### hand-written analysis" in second and "keep me" in second
    assert second != first + "\n### hand-written analysis\n"


def test_plan_alternates_systems() -> None:
    order = plan(["a", "b", "c"], 3)
    assert [s for _, s in order] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert [r for r, _ in order] == [1, 1, 1, 2, 2, 2, 3, 3, 3]


@pytest.mark.parametrize("args", [["--systems", "kafka"], ["--workloads", "nope"], ["--repeats", "0"]])
def test_bad_arguments_are_refused(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--quick", *args]) == 2
    assert capsys.readouterr().err.strip()


def test_one_tiny_cometmq_session(tmp_path: Path) -> None:
    """Real ``cometmq serve`` processes and real client processes: produce and latency, a fresh server for each
    workload (as full mode runs them), then everything stopped."""
    import psutil

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    mode = Mode("tiny", repeats=1, produce_seconds=0.3, produce_max=2000, backlog=500, latency_count=20,
                latency_interval_ms=2.0, acked_seconds=0.2, acked_max=50, settle_s=0.2, settled_s=0.4,
                server_per_workload=True)
    lines: list[str] = []
    rows = run_all(["cometmq"], mode, tmp_path, lines.append, ("backlog", "produce_100b", "latency"))
    by = {r["workload"]: r for r in rows}
    assert not [r for r in rows if "error" in r], rows
    assert [r["workload"] for r in rows] == ["startup", "rss", "consume", "startup", "produce_100b", "startup",
                                             "latency"]
    assert len([p for p in tmp_path.glob("cometmq-r1-*.log") if "-client-" not in p.name]) == 3  # 3 servers' logs
    assert by["produce_100b"]["messages"] > 0 and by["produce_100b"]["msgs_per_s"] > 0
    assert by["consume"]["messages"] >= 500
    assert by["latency"]["received"] == 20 and by["latency"]["median_ms"] is not None
    assert by["rss"]["backlog_mib"] > 0 and by["rss"]["backlog_settled_mib"] > 0
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before  # nothing left running
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]  # data folders removed, logs kept
