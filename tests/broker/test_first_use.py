"""broker/first_use.py: the one rule the broker's parts built on first use follow (POP, transactions, the timer)."""

from __future__ import annotations

import pytest

from cometmq.broker.first_use import BuiltOnFirstUse


class Part:
    def __init__(self) -> None:
        self.events: list[str] = []
        self.value = 7


class Front(BuiltOnFirstUse[Part]):
    def __init__(self, state: bool = False) -> None:
        super().__init__()
        self.state = state
        self.made = 0
        #: loads that fail before one succeeds (a full disk, say)
        self.failing_loads = 0

    def _make(self) -> Part:
        self.made += 1
        return Part()

    def _holds_state(self) -> bool:
        return self.state

    def _load_part(self, part: Part) -> None:
        if self.failing_loads:
            self.failing_loads -= 1
            raise OSError("no space left on device")
        part.events.append("load")

    def _start_part(self, part: Part) -> None:
        part.events.append("start")

    async def _stop_part(self, part: Part) -> None:
        part.events.append("stop")


async def test_a_master_with_nothing_to_resume_builds_at_the_first_use_loaded_and_started() -> None:
    f = Front()
    f.load()
    await f.start()
    assert not f.built and f.made == 0
    assert f.value == 7  # a look at the part builds it, once
    assert f.built and f.made == 1 and f._get().events == ["load", "start"]
    await f.stop()
    assert f._get().events == ["load", "start", "stop"]


async def test_state_to_resume_builds_it_at_load() -> None:
    f = Front(state=True)
    f.load()
    assert f.built and f._get().events == ["load"]
    await f.start()
    assert f._get().events == ["load", "start"]


async def test_built_on_a_replica_it_is_neither_loaded_nor_started_until_the_master_services_run() -> None:
    f = Front()
    part = f._get()  # (a request to a replica)
    assert part.events == []
    f.load()
    await f.start()
    assert part.events == ["load", "start"] and f.made == 1
    await f.stop()
    f._part = None
    f._get()
    assert f._get().events == []  # stopped: a part built now waits for the next load


def test_private_names_are_not_handed_on() -> None:
    f = Front()
    with pytest.raises(AttributeError):
        f._missing  # noqa: B018
    assert not f.built


async def test_a_part_whose_load_fails_is_not_kept_half_built() -> None:
    f = Front()
    f.load()
    await f.start()
    f.failing_loads = 1
    with pytest.raises(OSError, match="no space"):
        f._get()
    assert not f.built  # the next use tries again
    assert f._get().events == ["load", "start"] and f.made == 2
