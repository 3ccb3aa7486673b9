"""bench/trace_latency.py: events of two processes are placed against the send they follow."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from trace_latency import sides, steps, tails


def test_steps_places_each_event_after_its_send_and_numbers_repeats() -> None:
    client, broker = [], []
    for i, t0 in enumerate((1_000_000, 3_000_000, 5_000_000)):
        client += [("T0", t0), ("write>", t0 + 20_000), ("write>", t0 + 200_000), ("listener", t0 + 150_000 + i)]
        broker += [("recv>", t0 + 40_000 + 1000 * i)]
    broker.append(("recv>", 5_000_000 + 1_950_000))  # past the window: belongs to no send
    rows = steps(client, broker, window_ns=1_900_000)
    assert [(step, n) for _, step, n in rows] == [
        ("c:T0", 3), ("c:write>", 3), ("b:recv>", 3), ("c:listener", 3), ("c:write>#2", 3)]
    assert [round(us, 3) for us, _, _ in rows] == [0.0, 20.0, 41.0, 150.001, 200.0]


def test_steps_drops_what_most_sends_did_not_see() -> None:
    client = [("T0", 0), ("T0", 2_000_000), ("T0", 4_000_000), ("rare", 4_000_010)]
    assert [step for _, step, _ in steps(client, [], 1_900_000)] == ["c:T0"]


def test_tails_lists_the_slowest_sends_and_the_passes_they_waited_behind() -> None:
    client, broker = [], []
    for k in range(200):
        t0 = 10_000_000 + k * 2_000_000
        slow = 300_000 if k == 7 else 0
        client += [("T0", t0), ("listener", t0 + 100_000 + slow + k)]
        broker += [("recv>", t0 + 40_000 + slow)]
    broker += [("pass:IndexBuilder>", 10_000_000 + 7 * 2_000_000 + 30_000),
               ("pass:IndexBuilder<", 10_000_000 + 7 * 2_000_000 + 330_000),
               ("pass:WarmService>", 10_000_000 + 199 * 2_000_000 - 1_500_000)]  # before the 1 ms lead: not counted
    slowest, passes, worst = tails(client, broker, show=2)
    assert [round(us) for us, _ in slowest] == [400, 100]
    assert [label for label, _ in slowest[0][1]] == ["c:T0", "b:pass:IndexBuilder>", "b:pass:IndexBuilder<",
                                                    "b:recv>", "c:listener"]
    assert worst == 3 and passes == {"IndexBuilder": 1}
    assert tails(client, broker, show=0)[0] == []
    assert len(tails(client, broker, show=500)[0]) == 200  # more asked for than there are: every send


def test_sides_split_the_path_by_who_runs_it() -> None:
    rows = [(0.0, "c:T0", 9), (10.0, "c:startreq>", 9), (30.0, "b:recv>", 9), (55.0, "b:sframe>", 9),
            (70.0, "c:crecv>", 9), (90.0, "c:listener", 9), (95.0, "b:sframe>#2", 9)]
    assert sides(rows) == ("# sides (us): client until its write 10.0, broker read -> answer written 25.0, "
                           "client answer read -> listener 20.0, kernel and wake-ups 35.0")
    assert sides(rows[:3]) == "# sides: a step is missing (b:sframe>, c:crecv>, c:listener)"
