"""Damaged store files under a stopped broker: build a store, damage one file, restart, check what is served.

:func:`build_store` starts a ``cometmq serve`` (tests/fuzz/live_broker.LiveBroker), writes messages of every
kind (normal messages on two queues, 4.x delay-level and 5.x timer messages, a POP-consumed topic with acks and
an unacked receipt, a transactional half message), stops it (SIGTERM or SIGKILL) and keeps the data folder as the
pristine copy. :func:`damage` picks ONE file with a seeded RNG among the store's files (by kind: commit log
segments, consume queues, index files, checkpoint, abort marker, POP log and snapshot, timer log and wheel, epoch
file, config JSONs) and flips bytes, truncates, zeroes a range or appends garbage. :func:`check_restart` starts
the broker on the damaged copy and judges the outcome (:class:`Outcome`).

The rules (what "consistent" means; docs/reliability.md has the table):

* the broker starts (``cometmq serving`` within the timeout), or exits non-zero naming the damaged file's path or
  name in its log; either way no Python traceback in the log and no hang;
* every message it serves on the checked topic is exactly the one written at that queue offset (the body carries
  topic, queue and offset), offsets are contiguous from the queue's min offset to its max offset;
* messages whose data is not in the damaged file are all still served: damage to an index file, the POP log, the
  timer log/wheel, the epoch file, the checkpoint or the abort marker must lose no message of the checked topic; a
  damaged commit log segment or consume queue may lose messages, but only a suffix of a queue (never a hole);
* it still takes a new message and serves it back, and stops cleanly on SIGTERM.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.fuzz.live_broker import GoodClient, LiveBroker
from tests.interop.cometmq_server import ServerError

TOPIC = "FILES_T"
POP_TOPIC = "FILES_POP"
QUEUES = 2
PER_QUEUE = 40


def body_of(topic: str, queue: int, offset: int) -> bytes:
    return f"{topic}|{queue}|{offset}|".encode() + bytes(range(offset % 7, 40))


# -- building the pristine store ------------------------------------------------------------------------------


def build_store(workdir: Path, *, hard_stop: bool) -> Path:
    """Write the messages, stop the broker; the data folder (its path is returned) is the pristine copy."""
    broker = LiveBroker(workdir)
    broker.start(timeout=60)
    good = GoodClient(broker.namesrv)
    try:
        good.create_topic(TOPIC, QUEUES)
        for i in range(PER_QUEUE):
            for q in range(QUEUES):
                got = good.send(TOPIC, body_of(TOPIC, q, i), q)
                assert got == i, f"pristine store: {TOPIC}/{q} message {i} got offset {got}"
        _extras(good, broker)
    finally:
        good.close()
    if hard_stop:
        broker.kill()
    else:
        rc = broker.stop()
        assert rc == 0, f"SIGTERM exit code {rc}:\n{broker.log_tail()}"
    return broker.data_dir


def _extras(good: GoodClient, broker: LiveBroker) -> None:
    """Delay-level and timer messages, POP (acked and not), a transactional half message."""
    from cometmq.client import Message
    from cometmq.client.simple_consumer import SimpleConsumer
    from cometmq.client.transaction_producer import TransactionProducer

    async def go() -> None:
        p = good.producer
        for i in range(3):
            await p.send(Message(TOPIC + "_D", f"delay {i}".encode(), delay_level=1 + i % 3))
            await p.send(Message(TOPIC + "_D", f"timer {i}".encode(), delay=1.0 + i))
            await p.send(Message(TOPIC + "_D", f"far timer {i}".encode(), delay=3600.0))
        for i in range(10):
            await p.send(Message(POP_TOPIC, f"pop {i}".encode()))
        c = SimpleConsumer("FILES_POP_CG", namesrv=broker.namesrv, invisible_duration=60.0, await_duration=1.0,
                           consume_from="first")
        await c.start()
        try:
            c.subscribe(POP_TOPIC)
            got = []
            for _ in range(5):
                got += await c.receive(8)
                if len(got) >= 6:
                    break
            for m in got[:4]:
                await c.ack(m)
        finally:
            await c.close()
        tp = TransactionProducer("FILES_TX_PG", namesrv=broker.namesrv)
        await tp.start()
        try:
            await tp.send_half(Message(TOPIC + "_TX", b"half"))
        finally:
            await tp.close()

    good.create_topic(TOPIC + "_D", 1)
    good.create_topic(POP_TOPIC, 2)
    good.create_topic(TOPIC + "_TX", 1)
    good.lt.run(go(), 60)
    good.lt.run(asyncio.sleep(2.5))  # delay-level and short timer messages come due, the POP log flushes


# -- choosing and damaging one file ----------------------------------------------------------------------------

KINDS = ["commitlog", "consumequeue", "index", "checkpoint", "abort", "poplog", "timerlog", "timerwheel",
         "timer_checkpoint", "epoch", "config"]


def classify(rel: Path) -> str:
    parts = rel.parts
    name = rel.name
    if parts[0] == "commitlog":
        return "commitlog"
    if parts[0] == "consumequeue":
        return "consumequeue"
    if parts[0] == "index":
        return "index"
    if name == "checkpoint":
        return "checkpoint"
    if name == "abort":
        return "abort"
    if "pop" in str(rel).lower():
        return "poplog"
    if "timerlog" in parts:
        return "timerlog"
    if name == "timerwheel":
        return "timerwheel"
    if "timer" in str(rel).lower():
        return "timer_checkpoint"
    if "epoch" in name.lower():
        return "epoch"
    if parts[0] == "config" or name.endswith(".json"):
        return "config"
    return "other"


def store_files(data: Path) -> dict[str, list[Path]]:
    """The store's non-empty files by kind (paths relative to ``data``)."""
    out: dict[str, list[Path]] = {}
    for path in sorted(data.rglob("*")):
        if path.is_file() and path.stat().st_size > 0:
            rel = path.relative_to(data)
            out.setdefault(classify(rel), []).append(rel)
    return out


@dataclass
class Damage:
    seed: int
    kind: str
    file: str
    mutation: str
    detail: str

    def __str__(self) -> str:
        return f"seed {self.seed}: {self.kind} {self.file}: {self.mutation} {self.detail}"


def _used_length(raw: bytes) -> int:
    """Where a preallocated file's data ends (its zero tail), so that damage lands on data most of the time."""
    end = len(raw.rstrip(b"\x00"))
    return max(end, 1)


def damage(data: Path, seed: int, kinds: list[str] | None = None) -> Damage:
    rng = random.Random(seed)
    files = store_files(data)
    choices = [k for k in (kinds or KINDS) if files.get(k)]
    kind = rng.choice(choices)
    rel = rng.choice(files[kind])
    path = data / rel
    raw = bytearray(path.read_bytes())
    used = _used_length(bytes(raw))
    mutation = rng.choice(["flip", "flip", "truncate", "zero", "append", "flip_header"])
    if mutation == "flip":
        spots = sorted(rng.randrange(used) for _ in range(rng.randint(1, 8)))
        for i in spots:
            raw[i] ^= 1 << rng.randrange(8)
        detail = f"bits at {spots}"
    elif mutation == "flip_header":
        i = rng.randrange(min(used, 64))
        raw[i] ^= 0xFF
        detail = f"byte {i} inverted"
    elif mutation == "truncate":
        cut = rng.randrange(used)
        del raw[cut:]
        detail = f"to {cut} of {len(path.read_bytes())} bytes"
    elif mutation == "zero":
        start = rng.randrange(used)
        n = rng.randint(1, 4096)
        raw[start:start + n] = bytes(len(raw[start:start + n]))
        detail = f"{n} bytes from {start}"
    else:
        extra = rng.randbytes(rng.randint(1, 512))
        raw += extra
        detail = f"{len(extra)} garbage bytes"
    path.write_bytes(bytes(raw))
    return Damage(seed, kind, str(rel), mutation, detail)


# -- restarting on the damaged copy ----------------------------------------------------------------------------

#: kinds whose damage must not lose a message of the checked topic
NO_LOSS_KINDS = {"index", "poplog", "timerlog", "timerwheel", "timer_checkpoint", "epoch", "checkpoint", "abort"}


@dataclass
class Outcome:
    damage: Damage
    started: bool = False
    refused: str = ""
    served: dict[int, int] = dataclasses.field(default_factory=dict)  # queue -> messages served
    lost: dict[int, int] = dataclasses.field(default_factory=dict)
    problems: list[str] = dataclasses.field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"damage": str(self.damage), "started": self.started, "refused": self.refused,
                "served": self.served, "lost": self.lost, "problems": self.problems}


def check_restart(workdir: Path, pristine: Path, seed: int, kinds: list[str] | None = None,
                  start_timeout: float = 60.0) -> Outcome:
    broker = LiveBroker(workdir)
    shutil.copytree(pristine, broker.data_dir)
    out = Outcome(damage(broker.data_dir, seed, kinds))
    try:
        broker.start(timeout=start_timeout)
    except ServerError as exc:
        text = broker.all_logs()
        out.refused = str(exc).splitlines()[0]
        if broker.proc is not None and broker.proc.returncode is None:
            out.problems.append(f"no 'cometmq serving' within {start_timeout}s (hang)")
        if "Traceback" in text:
            out.problems.append("traceback in the log of a refused start:\n" + text[-3000:])
        names = {Path(out.damage.file).name, out.damage.file, Path(out.damage.file).parent.name}
        if not any(n and n in text for n in names):
            out.problems.append(f"refused to start without naming {out.damage.file}:\n{text[-1500:]}")
        broker.kill()
        return out
    out.started = True
    try:
        _check_served(broker, out)
    except Exception as exc:  # a client error is an outcome to report, not a harness failure
        out.problems.append(f"serving after restart failed: {type(exc).__name__}: {exc}")
    finally:
        text = broker.all_logs()
        if broker.running:
            assert broker.proc is not None
            broker.proc.send_signal(signal.SIGTERM)
            try:
                rc = broker.proc.wait(30)
                if rc != 0:
                    out.problems.append(f"exit code {rc} on SIGTERM after restart")
            except Exception:
                out.problems.append("did not stop within 30 s of SIGTERM")
                broker.kill()
        else:
            out.problems.append(f"broker exited while serving (rc {broker.proc and broker.proc.returncode})")
        text = broker.all_logs()
        if "Traceback" in text:
            out.problems.append("traceback in the broker log:\n" + _first_traceback(text))
    return out


def _first_traceback(text: str) -> str:
    i = text.index("Traceback")
    start = text.rfind("\n", 0, max(0, i - 300)) + 1
    return text[start:i + 2500]


def _check_served(broker: LiveBroker, out: Outcome) -> None:
    from cometmq.client import MessageQueue

    good = GoodClient(broker.namesrv)
    try:
        try:
            good.create_topic(TOPIC, QUEUES)  # a damaged topics.json may have lost it: recreate (same queues)
        except Exception as exc:
            out.problems.append(f"cannot (re)create {TOPIC}: {exc}")
            return
        for q in range(QUEUES):
            mq = MessageQueue(TOPIC, good.broker_name, q)
            lo = good.lt.run(good.admin.min_offset(mq))
            hi = good.lt.run(good.admin.max_offset(mq))
            offsets: list[int] = []
            pos = lo
            while pos < hi:
                msgs = good.pull(TOPIC, q, pos, 32)
                if not msgs:
                    out.problems.append(f"{TOPIC}/{q}: nothing served at {pos} (min {lo}, max {hi})")
                    break
                for off, body in msgs:
                    if body != body_of(TOPIC, q, off):
                        out.problems.append(f"{TOPIC}/{q} offset {off}: served a wrong body {body[:60]!r}")
                    offsets.append(off)
                pos = msgs[-1][0] + 1
            if offsets != list(range(lo, lo + len(offsets))):
                out.problems.append(f"{TOPIC}/{q}: offsets not contiguous: {offsets}")
            out.served[q] = len(offsets)
            out.lost[q] = PER_QUEUE - len(offsets)
            if lo != 0:
                out.problems.append(f"{TOPIC}/{q}: min offset {lo} (messages lost from the head)")
            if out.damage.kind in NO_LOSS_KINDS and len(offsets) != PER_QUEUE:
                out.problems.append(f"{TOPIC}/{q}: {len(offsets)} of {PER_QUEUE} messages served after damage "
                                    f"to {out.damage.kind}, which holds no message data")
            # a new message is taken and served back at the next offset
            new = good.send(TOPIC, body_of(TOPIC, q, hi), q)
            if new != hi:
                out.problems.append(f"{TOPIC}/{q}: new message got offset {new}, max offset was {hi}")
            got = good.pull(TOPIC, q, new, 1)
            if got != [(new, body_of(TOPIC, q, hi))]:
                out.problems.append(f"{TOPIC}/{q}: new message at {new} pulled back as {got!r}")
    finally:
        good.close()
