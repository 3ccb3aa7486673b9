"""The testing kit every suite shares: one fake clock and one way to wait for a condition.

``FakeClock`` is the injected millisecond clock (timer wheel, lock expiry, POP invisibility, retention), so tests
move time instead of sleeping for it. ``eventually`` (async) and ``wait_until`` (sync, for threads and subprocesses)
poll a predicate until it holds and fail naming what they waited for.
"""

from tests.kit.clock import START_MS, FakeClock, wall_ms
from tests.kit.wait import eventually, wait_until

__all__ = ["START_MS", "FakeClock", "eventually", "wait_until", "wall_ms"]
