"""The testing kit every suite shares: one fake clock and one way to wait for a condition.

``FakeClock`` is the injected millisecond clock (timer wheel, lock expiry, POP invisibility, retention), so tests
move time instead of sleeping for it. ``eventually`` (async) and ``wait_until`` (sync, for threads and subprocesses)
poll a predicate until it holds and fail naming what they waited for. ``EtcdCluster`` runs a real etcd cluster
(subprocesses on loopback) for the controller's ``EtcdLog``.
"""

from tests.kit.clock import START_MS, FakeClock, wall_ms
from tests.kit.etcd import EtcdCluster
from tests.kit.wait import eventually, wait_until

__all__ = ["START_MS", "EtcdCluster", "FakeClock", "eventually", "wait_until", "wall_ms"]
