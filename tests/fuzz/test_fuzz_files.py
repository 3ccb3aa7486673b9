"""Damaged store files before a restart ([15]; marker ``fuzz``): tests/fuzz/files.py has the rules.

Two pristine stores are built once (the broker stopped with SIGTERM, and with SIGKILL); each round copies one,
damages ONE file chosen by ``random.Random(seed)`` (kinds taken in turn, so a short run still covers every kind),
restarts the broker on it and checks the outcome. All rounds run; the test fails at the end listing every round
with a problem, each with its seed, file and mutation (``COMETMQ_FUZZ_SEED`` sets the first seed; a round is
reproduced by the same seed, kind and variant: see ``one_round``).
"""

from __future__ import annotations

import os
import shutil
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.fuzz.files import KINDS, build_store, check_restart, store_files
from tests.fuzz.live_broker import fuzz_seconds, write_report

pytestmark = pytest.mark.fuzz

#: CI default (seconds); COMETMQ_FUZZ_SECONDS overrides it
FILES_SECONDS = 10.0


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {variant: build_store(tmp_path_factory.mktemp(f"pristine-{variant}"), hard_stop=variant == "sigkill")
            for variant in ("sigterm", "sigkill")}


#: the data folders of rounds with problems kept for a look (the first ones); a clean round's is removed at once
KEEP_BAD_ROUNDS = 10


def one_round(tmp: Path, pristine: dict[str, Path], seed: int, kind: str, variant: str,
              keep: bool) -> dict[str, object]:
    workdir = tmp / f"round-{seed}-{variant}"
    out = check_restart(workdir, pristine[variant], seed, [kind])
    if not (out.problems and keep):
        shutil.rmtree(workdir, ignore_errors=True)  # ~40 MB a round: a long run would fill the disk
    return {"variant": variant, **out.as_dict()}


@pytest.mark.timeout(int(fuzz_seconds(FILES_SECONDS)) + 300)
def test_damaged_files(pristine: dict[str, Path], tmp_path: Path) -> None:
    budget = fuzz_seconds(FILES_SECONDS)
    first_seed = int(os.environ.get("COMETMQ_FUZZ_SEED", "1"))
    deadline = time.monotonic() + budget
    present = {v: sorted(k for k in store_files(p)) for v, p in pristine.items()}
    rounds: list[dict[str, object]] = []
    i = 0
    while time.monotonic() < deadline or i < 2:
        variant = ("sigterm", "sigkill")[i % 2]
        kinds = [k for k in KINDS if k in present[variant]]
        kind = kinds[(i // 2) % len(kinds)]
        kept = sum(1 for r in rounds if r["problems"])
        rounds.append(one_round(tmp_path, pristine, first_seed + i, kind, variant, kept < KEEP_BAD_ROUNDS))
        i += 1
    bad = [r for r in rounds if r["problems"]]
    summary = {"rounds": len(rounds), "seconds": budget, "first_seed": first_seed,
               "by_kind": dict(Counter(str(r["damage"]).split(": ")[1].split(" ")[0] for r in rounds)),
               "started": sum(1 for r in rounds if r["started"]),
               "refused": sum(1 for r in rounds if r["refused"]),
               "with_problems": len(bad), "files_present": present, "rounds_detail": rounds}
    write_report("files", summary)
    print(f"\nfiles: {len(rounds)} rounds, {summary['started']} started, {summary['refused']} refused, "
          f"{len(bad)} with problems; by kind {summary['by_kind']}")
    assert not bad, "damaged-file rounds with problems:\n" + "\n\n".join(
        f"[{r['variant']}] {r['damage']}\n  " + "\n  ".join(str(p) for p in r["problems"]) for r in bad)  # type: ignore[attr-defined]
