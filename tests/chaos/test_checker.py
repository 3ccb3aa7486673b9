"""The chaos checker against small hand-made histories and commit logs (one violation each), and one short real
run: a broker in this process, producers and readers for ~2 s, the drain, the check."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from cometmq.client import Admin
from cometmq.namesrv.server import NamesrvConfig, NamesrvController
from cometmq.protocol.message import MessageRecord, encode_record
from cometmq.store.epoch_file import encode
from tests.broker.conftest import StartBroker, start_broker  # noqa: F401  (the broker suite's fixture)
from tests.chaos.checker import FinalBroker, Result, check
from tests.chaos.history import History, Op, Seen, load
from tests.chaos.workload import Producers, Readers, drain, surely_not_written
from tests.kit import eventually

TOPIC = "ChaosT"
SEGMENT = 64 * 1024

#: (queue id, queue offset, payload) in log order
Rows = Sequence[tuple[int, int, str]]
CLEAN: Rows = [(0, 0, "r-p0-0"), (1, 0, "r-p0-1"), (0, 1, "r-p1-0"), (1, 1, "r-p1-1"), (0, 2, "r-p0-2")]


def write_broker(path: Path, rows: Rows, epochs: Sequence[tuple[int, int]] = ((1, 0),), *,
                 topic: str = TOPIC) -> Path:
    """A broker data folder with one commit-log segment holding ``rows`` and an epoch file."""
    data = b""
    for q, off, payload in rows:
        data += encode_record(MessageRecord(topic=topic, body=payload.encode(), queue_id=q, queue_offset=off,
                                            physical_offset=len(data), properties={"UNIQ_KEY": payload}))
    (path / "commitlog").mkdir(parents=True)
    (path / "commitlog" / f"{0:020d}").write_bytes(data + bytes(SEGMENT - len(data)))
    if epochs:
        (path / "epochFileCheckpoint").write_bytes(encode(list(epochs)))
    return path


def write_history(path: Path, sends: Sequence[tuple[str, str, int | None, int | None]],
                  reads: Sequence[Seen] = (), drained: Sequence[Seen] | None = None) -> Path:
    """``sends``: (payload, ok|fail|info|pending, queue id, queue offset)."""
    with History(path) as h:
        for payload, kind, q, off in sends:
            proc = payload.split("-")[1]
            h.record(proc, "invoke", "send", payload)
            if kind == "ok":
                h.record(proc, "ok", "send", payload, broker_name="b", broker_addr="127.0.0.1:1", queue_id=q,
                         queue_offset=off, msg_id="X", status="SEND_OK", attempts=1)
            elif kind in ("fail", "info"):
                h.record(proc, kind, "send", payload, error="boom", attempts=1)  # type: ignore[arg-type]
        for m in reads:
            h.record("r0", "ok", "read", None, broker_addr=m.broker_addr, queue_id=m.queue_id, messages=[m])
        if drained is not None:
            h.record("drain", "ok", "drain", None, messages=drained)
    return path


def seen(rows: Rows) -> list[Seen]:
    return [Seen(p, q, off, "127.0.0.1:1") for q, off, p in rows]


def ok_sends(rows: Rows) -> list[tuple[str, str, int | None, int | None]]:
    return [(p, "ok", q, off) for q, off, p in rows]


def run_check(tmp_path: Path, *, master: Rows = CLEAN, replica: Rows | None = CLEAN,
              sends: Sequence[tuple[str, str, int | None, int | None]] | None = None,
              reads: Sequence[Seen] = (), drained: Sequence[Seen] | None = None,
              master_epochs: Sequence[tuple[int, int]] = ((1, 0),),
              replica_epochs: Sequence[tuple[int, int]] = ((1, 0),),
              observations: Sequence[tuple[int, int | str]] = ()) -> Result:
    hist = write_history(tmp_path / "history.jsonl", ok_sends(CLEAN) if sends is None else sends, reads,
                         seen(master) if drained is None else drained)
    brokers = [FinalBroker("b0", write_broker(tmp_path / "b0", master, master_epochs), master=True)]
    if replica is not None:
        brokers.append(FinalBroker("b1", write_broker(tmp_path / "b1", replica, replica_epochs)))
    result = check(hist, brokers, TOPIC, master_observations=observations)
    print(result.report())
    return result


def failed(result: Result) -> set[str]:
    return set(result.failed())


# -- a clean run ----------------------------------------------------------------------------------------------------
def test_a_clean_history_passes_with_its_counts(tmp_path: Path) -> None:
    r = run_check(tmp_path, reads=seen(CLEAN[:3]), observations=[(1, 0), (1, 0), (2, 1)])
    assert r.ok, r.report()
    assert r.counts["invoked"] == r.counts["ok"] == 5
    assert r.counts["read_messages"] == 3 and r.counts["drained"] == 5 and r.counts["master_records"] == 5
    assert r.replicas == {"b1": "identical"}
    as_json = json.loads(r.dumps())
    assert as_json["ok"] is True and set(as_json["invariants"]) >= {"no_acked_loss", "no_divergence"}
    assert "PASS" in r.report()


def test_a_replica_behind_is_a_prefix_and_passes(tmp_path: Path) -> None:
    r = run_check(tmp_path, replica=CLEAN[:3])
    assert r.ok, r.report()
    assert r.replicas == {"b1": "prefix"}


def test_indeterminate_failed_and_duplicated_sends_are_counted(tmp_path: Path) -> None:
    master = [*CLEAN, (1, 2, "r-p2-0"), (1, 3, "r-p0-0")]  # an indeterminate one stored; p0-0 stored twice
    sends = [*ok_sends(CLEAN), ("r-p2-0", "info", None, None), ("r-p2-1", "info", None, None),
             ("r-p2-2", "fail", None, None), ("r-p2-3", "pending", None, None)]
    r = run_check(tmp_path, master=master, replica=master, sends=sends)
    assert r.ok, r.report()
    c = r.counts
    assert (c["ok"], c["fail"], c["info"]) == (5, 1, 3)
    assert (c["info_found"], c["info_not_found"]) == (1, 2)
    assert (c["duplicates"], c["duplicate_records"]) == (1, 1)


# -- one violation each ---------------------------------------------------------------------------------------------
def test_an_acknowledged_payload_missing_from_the_log_is_a_loss(tmp_path: Path) -> None:
    sends = [*ok_sends(CLEAN), ("r-p3-0", "ok", 0, 3)]
    r = run_check(tmp_path, sends=sends)
    assert failed(r) == {"no_acked_loss"}
    assert r.counts["ok_lost"] == 1
    assert any("r-p3-0" in v for v in r.invariants["no_acked_loss"].violations)


def test_an_acknowledged_payload_at_another_offset_is_a_loss(tmp_path: Path) -> None:
    sends = [(p, "ok", q, off + 1 if p == "r-p0-0" else off) for p, _, q, off in ok_sends(CLEAN)
             if off is not None]
    r = run_check(tmp_path, sends=sends)
    assert failed(r) == {"no_acked_loss"}
    assert r.counts["ok_offset_mismatch"] == 1


def test_an_acknowledged_payload_missing_from_the_drain_is_a_loss(tmp_path: Path) -> None:
    r = run_check(tmp_path, drained=seen(CLEAN[:-1]))
    assert failed(r) == {"no_acked_loss"}
    assert r.counts["ok_not_drained"] == 1


def test_a_stored_payload_never_sent_is_a_phantom(tmp_path: Path) -> None:
    master = [*CLEAN, (1, 2, "r-p9-9")]
    r = run_check(tmp_path, master=master, replica=master)
    assert failed(r) == {"no_phantoms"}


def test_a_read_of_a_payload_never_sent_is_a_phantom_and_a_dirty_read(tmp_path: Path) -> None:
    r = run_check(tmp_path, reads=[Seen("ghost", 0, 7, "127.0.0.1:1")])
    assert failed(r) == {"no_phantoms", "no_dirty_reads"}


def test_a_flipped_body_byte_fails_the_crc(tmp_path: Path) -> None:
    hist = write_history(tmp_path / "h.jsonl", ok_sends(CLEAN))
    d = write_broker(tmp_path / "b0", CLEAN)
    seg = d / "commitlog" / f"{0:020d}"
    data = bytearray(seg.read_bytes())
    at = data.index(b"r-p1-0")
    data[at + 5] ^= 0x01  # "r-p1-1": still a payload that was sent, only the CRC tells
    seg.write_bytes(bytes(data))
    r = check(hist, [FinalBroker("b0", d, master=True)], TOPIC)
    assert "no_phantoms" in failed(r)
    assert any("CRC" in v for v in r.invariants["no_phantoms"].violations)


def test_a_gap_in_queue_offsets_fails_queue_integrity(tmp_path: Path) -> None:
    master = [(0, 0, "r-p0-0"), (1, 0, "r-p0-1"), (0, 2, "r-p1-0"), (1, 1, "r-p1-1"), (0, 3, "r-p0-2")]
    r = run_check(tmp_path, master=master, replica=master, sends=ok_sends(master))
    assert failed(r) == {"queue_integrity"}
    assert any("queue 0" in v for v in r.invariants["queue_integrity"].violations)


def test_two_messages_at_one_offset_fail_queue_integrity(tmp_path: Path) -> None:
    master = [*CLEAN, (0, 2, "r-p1-2")]
    sends = [*ok_sends(CLEAN), ("r-p1-2", "info", None, None)]
    r = run_check(tmp_path, master=master, replica=master, sends=sends)
    assert "queue_integrity" in failed(r)
    assert any("twice" in v for v in r.invariants["queue_integrity"].violations)


def test_a_replica_with_another_message_at_an_offset_diverges(tmp_path: Path) -> None:
    replica = [*CLEAN[:3], (1, 1, "r-p1-2")]  # the master has r-p1-1 there
    sends = [*ok_sends(CLEAN), ("r-p1-2", "info", None, None)]
    r = run_check(tmp_path, replica=replica, sends=sends)
    assert failed(r) == {"no_divergence", "queue_integrity"}
    assert r.replicas == {"b1": "diverged"}
    assert any("differs from the master's at byte" in v for v in r.invariants["no_divergence"].violations)


def test_a_replica_longer_than_the_master_diverges(tmp_path: Path) -> None:
    r = run_check(tmp_path, master=CLEAN[:3])
    sends_lost = r.counts["ok_lost"]
    assert "no_divergence" in failed(r) and sends_lost == 2  # and the master lost what it acknowledged


def test_epoch_files_disagreeing_on_a_shared_epoch_diverge(tmp_path: Path) -> None:
    r = run_check(tmp_path, master_epochs=[(1, 0), (3, 300)], replica_epochs=[(1, 0), (3, 200)])
    assert failed(r) == {"no_divergence"}
    assert any("epoch 3" in v for v in r.invariants["no_divergence"].violations)


def test_a_replica_with_data_of_an_epoch_the_master_lacks_diverges(tmp_path: Path) -> None:
    r = run_check(tmp_path, master_epochs=[(1, 0), (3, 100)], replica_epochs=[(1, 0), (2, 100)])
    assert failed(r) == {"no_divergence"}


def test_a_read_of_a_message_not_in_the_final_log_is_dirty(tmp_path: Path) -> None:
    sends = [*ok_sends(CLEAN), ("r-p4-0", "info", None, None)]
    r = run_check(tmp_path, sends=sends, reads=[Seen("r-p4-0", 1, 2, "127.0.0.1:9")])  # read, then truncated
    assert failed(r) == {"no_dirty_reads"}
    r2 = run_check(tmp_path / "2", sends=sends, reads=[Seen("r-p0-0", 1, 0, "127.0.0.1:9")])  # wrong place
    assert failed(r2) == {"no_dirty_reads"}


def test_two_masters_in_one_epoch(tmp_path: Path) -> None:
    r = run_check(tmp_path, observations=[(1, 0), (2, 1), (2, "0")])
    assert failed(r) == {"one_master_per_epoch"}


def test_a_refused_send_found_in_the_log(tmp_path: Path) -> None:
    sends = [*ok_sends(CLEAN[:-1]), (CLEAN[-1][2], "fail", None, None)]
    r = run_check(tmp_path, sends=sends)
    assert failed(r) == {"refused_not_stored"}


def test_exactly_one_final_master_is_required(tmp_path: Path) -> None:
    hist = write_history(tmp_path / "h.jsonl", [])
    with pytest.raises(ValueError, match="one final master"):
        check(hist, [FinalBroker("b0", write_broker(tmp_path / "b0", CLEAN))], TOPIC)


def test_the_history_round_trips_and_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    path = write_history(tmp_path / "h.jsonl", ok_sends(CLEAN[:1]), seen(CLEAN[:2]))
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"t": 1.0, "proc": "p0", "ty')
    ops = load(path)
    assert [(o.type, o.f) for o in ops] == [("invoke", "send"), ("ok", "send"), ("ok", "read"), ("ok", "read")]
    ok = ops[1]
    assert isinstance(ok, Op) and (ok.value, ok.queue_id, ok.queue_offset, ok.status) == ("r-p0-0", 0, 0, "SEND_OK")
    assert ops[2].messages == [Seen("r-p0-0", 0, 0, "127.0.0.1:1")]
    assert load([path, path])[0].t <= load([path, path])[-1].t


def test_send_errors_are_classified() -> None:
    from cometmq.client import BrokerError, ClientConnectionError, ClientTimeoutError, NoRouteError
    from cometmq.protocol.codes import ResponseCode

    assert surely_not_written(NoRouteError("x"))
    assert surely_not_written(BrokerError(ResponseCode.SERVICE_NOT_AVAILABLE, "replica"))
    assert surely_not_written(BrokerError(ResponseCode.SYSTEM_ERROR, "IN_SYNC_REPLICAS_NOT_ENOUGH: 1 of 2"))
    assert not surely_not_written(BrokerError(ResponseCode.SYSTEM_ERROR, "OS_ERROR: disk"))
    assert surely_not_written(ClientConnectionError("cannot talk to a (x): cannot connect to a: refused"))
    assert not surely_not_written(ClientConnectionError("cannot talk to a (x): connection lost"))
    assert not surely_not_written(ClientTimeoutError("no answer"))


# -- a short real run -------------------------------------------------------------------------------------------
@pytest.fixture
async def chaos_namesrv() -> AsyncIterator[str]:
    ns = NamesrvController(NamesrvConfig(port=0))
    await ns.start()
    try:
        yield f"127.0.0.1:{ns.port}"
    finally:
        await ns.stop()


async def test_a_short_run_against_one_broker_passes(tmp_path: Path, chaos_namesrv: str,
                                                     start_broker: StartBroker) -> None:  # noqa: F811
    ns = chaos_namesrv
    data_dir = tmp_path / "b0"
    broker = await start_broker(data_dir, namesrv_addr=ns, broker_name="chaos-b")
    async with Admin(namesrv=ns) as admin:
        await eventually(lambda: admin.create_topic(TOPIC, read_queues=4), 10, what="the topic created")
    hist_path = tmp_path / "history.jsonl"
    with History(hist_path) as h:
        producers = Producers(2, ns, TOPIC, h, run_id="e2e", concurrency=2, seed=1)
        readers = Readers(ns, TOPIC, h, seed=1, suspend_ms=200)
        await producers.start()
        await readers.start()
        await asyncio.sleep(2)
        await producers.stop()
        await asyncio.sleep(0.3)  # the readers see the last sends
        await readers.stop()
        drained = await drain(ns, TOPIC, h, timeout=20)
    await broker.stop()
    r = check(hist_path, [FinalBroker("b0", data_dir, master=True)], TOPIC)
    print(r.report())
    assert r.ok, r.report()
    c = r.counts
    assert c["ok"] > 20 and c["ok"] == producers.stats.ok and c["ok"] + c["fail"] + c["info"] == c["invoked"], c
    assert c["read_messages"] > 0 and c["drained"] == len(drained) == c["master_records"] >= c["ok"], c
    assert r.invariants["no_acked_loss"].skipped is None  # the drain was in the history


async def test_the_workers_survive_a_broker_restart_and_the_run_still_checks(
        tmp_path: Path, chaos_namesrv: str, start_broker: StartBroker) -> None:  # noqa: F811
    ns = chaos_namesrv
    data_dir = tmp_path / "b0"
    broker = await start_broker(data_dir, namesrv_addr=ns, broker_name="chaos-b")
    async with Admin(namesrv=ns) as admin:
        await eventually(lambda: admin.create_topic(TOPIC, read_queues=4), 10, what="the topic created")
    hist_path = tmp_path / "history.jsonl"
    with History(hist_path) as h:
        producers = Producers(2, ns, TOPIC, h, run_id="rs", rate=100, seed=2, send_timeout=1.0)
        readers = Readers(ns, TOPIC, h, seed=2, suspend_ms=200, pull_timeout=1.0)
        await producers.start()
        await readers.start()
        await asyncio.sleep(1)
        await broker.stop()
        await asyncio.sleep(1)  # every send and pull fails meanwhile
        broker = await start_broker(data_dir, namesrv_addr=ns, broker_name="chaos-b")  # another port
        ok_before = producers.stats.ok
        await eventually(lambda: producers.stats.ok > ok_before + 20, 15, what="sends to the restarted broker")
        await producers.stop()
        await asyncio.sleep(0.3)
        await readers.stop()
        await drain(ns, TOPIC, h, timeout=20)
    await broker.stop()
    r = check(hist_path, [FinalBroker("b0", data_dir, master=True)], TOPIC)
    print(r.report())
    assert r.ok, r.report()
    c = r.counts
    assert c["fail"] + c["info"] > 0, c  # the outage was logged
    assert readers.errors > 0
    assert c["ok"] > 100, c
