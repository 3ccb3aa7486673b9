"""A former master restarted as a replica must not serve the tail no replica acknowledged (as processes).

Consumers see only what the group confirmed (reference/controller-ha.md §1.4, invariant 5 "no dirty reads"). A
master killed with a tail its replica never got (those sends answered FLUSH_SLAVE_TIMEOUT) holds it in its log;
restarted as a replica, that tail is later cut by the handshake with the new master. Until then it must not be
readable: a consumer that read it saw messages that are gone from every log afterwards (and moved its offset
past queue offsets the new master fills with other messages).
"""

from __future__ import annotations

from tests.ha import test_rejoin
from tests.ha.cluster import Cluster
from tests.ha.test_rejoin import TOPIC, bodies, diverge

cluster = test_rejoin.cluster  # the same fixture: a group whose replica stays in the set while it is away


async def test_a_restarted_old_master_does_not_serve_its_unacknowledged_tail(cluster: Cluster) -> None:
    d = await diverge(cluster)
    await d.new.stop()  # the new master is away for now: the old one restarts with nobody to follow
    await d.old.start()
    seen = {r.body.decode() for r in (await cluster.pull_queue(d.old.addr, TOPIC, 0)).records}

    await d.new.start()
    assert (await cluster.promote(d.new, 3)).code == 0
    assert (await cluster.follow(d.old, d.new, 3, 2)).code == 0
    await cluster.wait_caught_up(d.old, d.new)
    await d.old.stop()
    final = bodies(d.old.log())
    assert not final & d.unacked  # the handshake cut the tail
    dirty = sorted(seen - final)
    assert not dirty, f"a reader of the restarted replica got {len(dirty)} messages no log keeps: {dirty[:5]}"
