"""The suite's port picker: picks in one process never repeat, and every pick is bindable when handed out."""

from __future__ import annotations

import socket

from tests.kit.ports import free_port, free_port_block


def test_picks_in_one_process_never_repeat() -> None:
    picks = [free_port() for _ in range(500)]
    assert len(set(picks)) == len(picks)


def test_a_block_does_not_overlap_the_next_pick() -> None:
    base = free_port_block(3, (0, 1, 2))
    block = {base + 10 * i + o for i in range(3) for o in (0, 1, 2)}
    after = {free_port() for _ in range(50)}
    assert not block & after


def test_a_pick_avoids_what_it_is_told_to_avoid_and_is_bindable() -> None:
    first = free_port()
    port = free_port_block(avoid=[first, first + 1])
    assert port not in (first, first + 1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
