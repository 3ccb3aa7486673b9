"""LocalLog: committed = synced; recovery drops a torn tail and refuses damage before it. Real files."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from cometmq.controller.events import decode_event, encode_event
from cometmq.controller.heartbeats import LiveInfo
from cometmq.controller.log import (
    FILE_NAME,
    MAGIC,
    MAX_BATCH_BYTES,
    MAX_ENTRY_BYTES,
    LocalLog,
    LogClosedError,
    LogCorruptError,
    LogError,
    ReplicatedLog,
    encode_frame,
    recover,
)
from cometmq.controller.state import ControllerState


async def opened(folder: Path, seen: list[tuple[int, bytes]] | None = None) -> LocalLog:
    log = LocalLog(folder, address="127.0.0.1:9878")
    if seen is not None:
        log.subscribe(lambda index, entry: seen.append((index, entry)))
    await log.start()
    return log


async def replay(folder: Path) -> list[bytes]:
    seen: list[tuple[int, bytes]] = []
    log = await opened(folder, seen)
    await log.stop()
    assert [i for i, _ in seen] == list(range(1, len(seen) + 1))
    return [entry for _, entry in seen]


def entries(n: int, size: int = 10) -> list[bytes]:
    return [bytes([i % 251]) * (size + i) for i in range(n)]


async def test_appends_are_indexed_applied_in_order_and_replayed(tmp_path: Path) -> None:
    seen: list[tuple[int, bytes]] = []
    log = await opened(tmp_path, seen)
    typed: ReplicatedLog = log
    assert typed.is_leader and typed.leader_address == "127.0.0.1:9878" and typed.applied_index == 0
    assert [await log.append(e) for e in entries(3)] == [1, 2, 3]
    assert seen == list(enumerate(entries(3), start=1))
    assert log.applied_index == 3
    await log.stop()
    assert await replay(tmp_path) == entries(3)


async def test_concurrent_appends_are_group_committed_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    syncs: list[int] = []
    real = os.fdatasync

    def counted(fd: int) -> None:
        syncs.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", counted)
    seen: list[tuple[int, bytes]] = []
    log = await opened(tmp_path, seen)
    data = entries(50)
    indexes = await asyncio.gather(*(log.append(e) for e in data))
    assert indexes == list(range(1, 51))
    assert [e for _, e in seen] == data
    assert 1 <= len(syncs) < 50  # batched
    await log.stop()
    assert await replay(tmp_path) == data


async def test_an_append_is_reported_only_after_the_sync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    real = os.fdatasync

    def noted(fd: int) -> None:
        events.append("sync")
        real(fd)

    monkeypatch.setattr(os, "fdatasync", noted)
    log = LocalLog(tmp_path)
    log.subscribe(lambda index, entry: events.append(f"apply {index}"))
    await log.start()
    await log.append(b"x")
    assert events == ["sync", "apply 1"]
    await log.stop()


def write_raw(folder: Path, data: bytes) -> Path:
    path = folder / FILE_NAME
    path.write_bytes(data)
    return path


async def test_a_torn_tail_written_by_hand_is_dropped(tmp_path: Path) -> None:
    good = entries(3)
    torn = encode_frame(b"never synced" * 10)[:25]
    path = write_raw(tmp_path, MAGIC + b"".join(encode_frame(e) for e in good) + torn)
    good_size = path.stat().st_size - len(torn)
    assert await replay(tmp_path) == good
    assert path.stat().st_size == good_size  # cut off the file, so the next append follows the good entries
    log = await opened(tmp_path)
    assert await log.append(b"after") == 4
    await log.stop()
    assert await replay(tmp_path) == [*good, b"after"]


async def test_crash_between_write_and_sync_at_every_byte(tmp_path: Path) -> None:
    """Simulate losing the unsynced end of the file: truncate anywhere in the last two frames."""
    log = await opened(tmp_path)
    data = entries(4)
    for e in data:
        await log.append(e)
    await log.stop()
    full = (tmp_path / FILE_NAME).read_bytes()
    ends = [len(MAGIC)]
    for e in data:
        ends.append(ends[-1] + 8 + len(e))
    for cut in range(ends[2], len(full)):
        folder = tmp_path / f"cut{cut}"
        folder.mkdir()
        write_raw(folder, full[:cut])
        complete = sum(1 for end in ends[1:] if end <= cut)
        assert await replay(folder) == data[:complete], cut


@pytest.mark.parametrize("damage", ["flip_last_payload", "flip_last_length", "zero_tail", "zeros_appended"])
async def test_damage_within_the_last_batch_is_a_torn_tail(tmp_path: Path, damage: str) -> None:
    data = entries(3)
    raw = bytearray(MAGIC + b"".join(encode_frame(e) for e in data))
    last = len(raw) - (8 + len(data[-1]))
    if damage == "flip_last_payload":
        raw[-1] ^= 0x40
    elif damage == "flip_last_length":
        raw[last + 3] ^= 0x01
    elif damage == "zero_tail":
        raw[last + 8:] = bytes(len(raw) - last - 8)
    else:
        raw += bytes(4096)  # a file extended with zeros by a crash
    write_raw(tmp_path, bytes(raw))
    expected = data if damage == "zeros_appended" else data[:2]
    assert await replay(tmp_path) == expected


async def test_damage_before_the_tail_refuses_to_start(tmp_path: Path) -> None:
    big = [bytes([i]) * (MAX_ENTRY_BYTES - 16) for i in range(MAX_BATCH_BYTES // MAX_ENTRY_BYTES + 2)]
    raw = bytearray(MAGIC + b"".join(encode_frame(e) for e in big))
    raw[len(MAGIC) + 100] ^= 0xFF  # inside the first entry, more than a batch before the end
    path = write_raw(tmp_path, bytes(raw))
    with pytest.raises(LogCorruptError):
        recover(path)
    log = LocalLog(tmp_path)
    with pytest.raises(LogCorruptError):
        await log.start()
    assert path.read_bytes() == bytes(raw)  # left as it is for the operator


@pytest.mark.parametrize(("content", "ok"), [(None, True), (b"", True), (b"CMQ", True), (b"\0\0\0", True),
                                             (MAGIC, True), (b"NOTALOG!", False), (b"garbage that is long", False)])
async def test_file_creation_and_a_foreign_file(tmp_path: Path, content: bytes | None, ok: bool) -> None:
    if content is not None:
        write_raw(tmp_path, content)
    if ok:
        assert await replay(tmp_path) == []
        assert (tmp_path / FILE_NAME).read_bytes() == MAGIC
    else:
        with pytest.raises(LogCorruptError):
            await LocalLog(tmp_path).start()


async def test_a_failed_sync_fails_the_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = await opened(tmp_path)
    await log.append(b"kept")

    def broken(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", broken)
    with pytest.raises(LogClosedError):
        await log.append(b"lost")
    monkeypatch.undo()
    with pytest.raises(LogClosedError):
        await log.append(b"after")  # the file's state is unknown: no more appends until a restart
    assert log.applied_index == 1
    await log.stop()
    assert (await replay(tmp_path))[0] == b"kept"


async def test_a_subscriber_that_raises_fails_the_log(tmp_path: Path) -> None:
    log = LocalLog(tmp_path)

    def apply(index: int, entry: bytes) -> None:
        if entry == b"bad":
            raise RuntimeError("bug")

    log.subscribe(apply)
    await log.start()
    with pytest.raises(LogClosedError):
        await log.append(b"bad")
    with pytest.raises(LogClosedError):
        await log.append(b"good")
    await log.stop()


async def test_lifecycle_errors(tmp_path: Path) -> None:
    log = LocalLog(tmp_path)
    with pytest.raises(LogClosedError):
        await log.append(b"x")
    await log.start()
    with pytest.raises(LogError):
        log.subscribe(lambda i, e: None)
    with pytest.raises(LogError):
        await log.start()
    with pytest.raises(ValueError):
        await log.append(bytes(MAX_ENTRY_BYTES + 1))
    await log.stop()
    await log.stop()
    with pytest.raises(LogClosedError):
        await log.append(b"x")


async def test_stop_finishes_appends_in_flight_and_a_cancelled_wait_still_commits(tmp_path: Path) -> None:
    log = await opened(tmp_path)
    waits = [asyncio.ensure_future(log.append(e)) for e in entries(5)]
    await asyncio.sleep(0)
    waits[0].cancel()
    await log.stop()
    assert all(w.done() for w in waits)
    assert [w.result() for w in waits[1:]] == [2, 3, 4, 5]
    assert await replay(tmp_path) == entries(5)


async def test_the_state_machine_survives_a_restart(tmp_path: Path) -> None:
    """The embedded controller's loop: decide, append, apply in the subscriber; a restart rebuilds the state."""
    state = ControllerState()
    outcomes: dict[int, int] = {}
    log = LocalLog(tmp_path)
    log.subscribe(lambda index, entry: outcomes.__setitem__(index, state.apply(decode_event(entry)).code))
    await log.start()
    now = 1_000
    evidence = [LiveInfo(1, "h:1", now), LiveInfo(2, "h:2", now)]
    decisions = [state.decide_apply_broker_id("C", "a", 1, "h:1;1")]
    for d in decisions:
        for e in d.events:
            assert outcomes[await log.append(encode_event(e))] == 0
    for d in [state.decide_apply_broker_id("C", "a", 2, "h:2;1"), state.decide_elect("a", 1, now, evidence)]:
        for e in d.events:
            assert outcomes[await log.append(encode_event(e))] == 0
    alter = state.decide_alter_sync_state_set("a", 1, 1, 1, {1, 2}, now, evidence)
    stale = state.decide_alter_sync_state_set("a", 1, 1, 1, {1}, now, evidence)
    assert stale.code == 2013  # unchanged: rejected when decided
    for e in alter.events:
        await log.append(encode_event(e))
    again = alter.events[0]
    assert outcomes[await log.append(encode_event(again))] == 2001  # a duplicate entry: fenced at apply
    await log.stop()

    rebuilt = ControllerState()
    log2 = LocalLog(tmp_path)

    def apply(index: int, entry: bytes) -> None:
        rebuilt.apply(decode_event(entry))

    log2.subscribe(apply)
    await log2.start()
    assert rebuilt.to_json() == state.to_json()
    assert log2.applied_index == 5
    await log2.stop()
