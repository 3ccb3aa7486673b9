"""Hostile frames against a live ``cometmq serve`` ([15]; marker ``fuzz``).

``test_hostile_batches``: batches of hostile frames (tests/fuzz/live_broker.py: every request code, hostile header
fields and bodies, byte-level damage, garbage) over several sockets at once, to the broker and the nameserver.
After every batch the broker process is alive, a good client (SDK Producer + Admin pull, its own topic) sends a
message and pulls it back at the offset it got, and the broker's RSS stays under a bound.

``test_stateful``: a hypothesis state machine interleaving the good client's operations (create a topic, send,
pull, commit an offset) with hostile batches; what was sent is pulled back byte for byte at its offset, committed
offsets read back as committed.

Both run for ``COMETMQ_FUZZ_SECONDS`` (CI: a short default each; the long run sets it, see docs/reliability.md).
Reproduce with ``--hypothesis-seed=N``; a failing batch is printed as hex (hypothesis ``note``) and written to
``COMETMQ_FUZZ_REPORT`` when that is set. At the end the broker log's ERROR lines are summarised (handler
tracebacks by request code) and checked against a small bound.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from tests.fuzz.live_broker import (
    GoodClient,
    LiveBroker,
    SendStats,
    batches,
    fuzz_seconds,
    send_batch,
    write_report,
)

pytestmark = pytest.mark.fuzz

#: CI defaults (seconds) of each test's budget; COMETMQ_FUZZ_SECONDS overrides both
BATCH_SECONDS = 10.0
STATEFUL_SECONDS = 10.0
#: the broker's RSS may grow this much over its size after start-up before the test fails
RSS_GROWTH_LIMIT = 400 << 20
#: handler tracebacks (and other ERROR lines) the log may hold at the end; every distinct one is reported anyway
MAX_ERROR_LINES = 50

#: no shrinking by default: the broker keeps the state earlier examples left, so a replay is not the same run
#: (COMETMQ_FUZZ_SHRINK=1 turns it on when minimising a failure found with --hypothesis-seed)
FUZZ_SETTINGS = settings(deadline=None, suppress_health_check=list(HealthCheck), print_blob=True,
                         phases=list(Phase) if os.environ.get("COMETMQ_FUZZ_SHRINK")
                         else [p for p in Phase if p is not Phase.shrink])


class Session:
    """One broker + good client for the module, and the numbers the report needs."""

    def __init__(self, workdir: Path) -> None:
        self.broker = LiveBroker(workdir)
        self.broker.start(timeout=60)
        self.good = GoodClient(self.broker.namesrv)
        self.good.create_topic("GOOD_T", 2)
        self.good.create_topic("fuzz", 4)  # the topic hostile frames name most (they may delete or change it)
        self.baseline_rss = self.broker.rss()
        self.stats = SendStats()
        self.batches = 0
        self.started = time.monotonic()
        self.addrs = [("127.0.0.1", self.broker.broker_port), ("127.0.0.1", self.broker.broker_port),
                      ("127.0.0.1", self.broker.namesrv_port)]

    def hostile(self, batch: list[tuple[int, bytes]]) -> None:
        note("batch as hex (lane, frame):\n" + "\n".join(f"{lane} {data[:4096].hex()}" for lane, data in batch))
        self.stats.add(send_batch(self.addrs, batch))
        self.batches += 1

    def check(self) -> None:
        assert self.broker.running, f"broker exited (rc {self.broker.proc and self.broker.proc.poll()}):\n" \
                                    f"{self.broker.log_tail()}"
        rss = self.broker.rss()
        assert rss - self.baseline_rss < RSS_GROWTH_LIMIT, \
            f"broker RSS {rss >> 20} MiB (start {self.baseline_rss >> 20})"

    def summary(self) -> dict[str, Any]:
        log = self.broker.log_summary()
        return {"seconds": round(time.monotonic() - self.started, 1), "batches": self.batches,
                "frames_sent": self.stats.frames, "bytes_sent": self.stats.bytes,
                "connections": self.stats.connects, "closed_by_server": self.stats.closed_by_server,
                "replies_by_code": dict(self.stats.replies.most_common()),
                "good_round_trips": self.good.round_trips, "baseline_rss_mib": self.baseline_rss >> 20,
                "max_rss_mib": self.broker.max_rss >> 20, "broker_alive": self.broker.running,
                "log": log.as_dict()}


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    s = Session(tmp_path_factory.mktemp("fuzz-live"))
    try:
        yield s
    finally:
        try:
            s.good.close()
        finally:
            s.broker.close()


def _finish(s: Session, name: str) -> None:
    summary = s.summary()
    write_report(name, summary)
    print(f"\n{name}: {summary}")
    s.check()
    s.good.round_trip("GOOD_T", "final")
    log = summary["log"]
    assert log["error_lines"] <= MAX_ERROR_LINES, f"ERROR flood in the broker log: {log}"


@pytest.mark.timeout(int(fuzz_seconds(BATCH_SECONDS)) + 240)
def test_hostile_batches(session: Session) -> None:
    budget = fuzz_seconds(BATCH_SECONDS)
    deadline = time.monotonic() + budget
    s = session

    @settings(FUZZ_SETTINGS, max_examples=max(10, int(budget * 4)))
    @given(batch=batches)
    def run(batch: list[tuple[int, bytes]]) -> None:
        if time.monotonic() > deadline:
            return
        s.hostile(batch)
        s.check()
        s.good.round_trip("GOOD_T", "batch")

    run()
    _finish(s, "live_batches")


@pytest.mark.timeout(int(fuzz_seconds(STATEFUL_SECONDS)) + 240)
def test_stateful(session: Session) -> None:
    budget = fuzz_seconds(STATEFUL_SECONDS)
    deadline = time.monotonic() + budget
    s = session
    counter = iter(range(10**9))

    class GoodAndHostile(RuleBasedStateMachine):
        """The good client's model: per (topic, queue) the bodies sent by offset, and the committed offset."""

        def __init__(self) -> None:
            super().__init__()
            self.topics: list[str] = []
            self.sent: dict[tuple[str, int], dict[int, bytes]] = {}
            self.committed: dict[tuple[str, int], int] = {}

        @initialize()
        def first_topic(self) -> None:
            self.new_topic()

        def _over(self) -> bool:
            return time.monotonic() > deadline

        @rule()
        def new_topic(self) -> None:
            if self._over() or len(self.topics) >= 3:
                return
            topic = f"GOOD_S{next(counter)}"
            s.good.create_topic(topic, 2)
            self.topics.append(topic)

        @rule(i=st.integers(0, 2), q=st.integers(0, 1), body=st.binary(min_size=1, max_size=300))
        def send(self, i: int, q: int, body: bytes) -> None:
            if self._over():
                return
            topic = self.topics[i % len(self.topics)]
            offset = s.good.send(topic, body, q)
            sent = self.sent.setdefault((topic, q), {})
            assert offset not in sent, f"offset {offset} of {topic}/{q} given twice"
            assert offset == len(sent), f"{topic}/{q}: offset {offset} after {len(sent)} sends (not contiguous)"
            sent[offset] = body

        @rule(i=st.integers(0, 2), q=st.integers(0, 1), start=st.integers(0, 40))
        def pull(self, i: int, q: int, start: int) -> None:
            if self._over():
                return
            topic = self.topics[i % len(self.topics)]
            sent = self.sent.get((topic, q), {})
            start = min(start, len(sent))
            got = s.good.pull(topic, q, start, 32)
            want = [(o, sent[o]) for o in range(start, min(len(sent), start + 32))]
            assert got == want, f"pull {topic}/{q} from {start}: got {got!r}, want {want!r}"

        @rule(i=st.integers(0, 2), q=st.integers(0, 1), offset=st.integers(0, 50))
        def commit(self, i: int, q: int, offset: int) -> None:
            if self._over():
                return
            topic = self.topics[i % len(self.topics)]
            s.good.commit(topic, q, offset)
            self.committed[(topic, q)] = offset

        @rule(batch=batches)
        def hostile(self, batch: list[tuple[int, bytes]]) -> None:
            if self._over():
                return
            s.hostile(batch)

        @invariant()
        def served(self) -> None:
            if self._over():
                return
            s.check()
            for (topic, q), offset in self.committed.items():
                got = s.good.committed(topic, q)
                assert got == offset, f"committed offset of {topic}/{q}: {got}, want {offset}"

    run_state_machine_as_test(GoodAndHostile, settings=settings(
        FUZZ_SETTINGS, max_examples=max(5, int(budget * 2)), stateful_step_count=25))
    _finish(s, "live_stateful")
