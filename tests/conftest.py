"""Suite-wide checks made once, before any test runs."""

from __future__ import annotations

import os
import tempfile

import pytest

from cometmq.store.message_store import usage_of

#: brokers refuse writes at diskSpaceWarningLevelRatio (90 % by default); the suite's brokers write to the temp
#: folder, so a run started above this share would fail by the hundred with "disk full" instead of saying why
DISK_LIMIT_PERCENT = 85


def pytest_sessionstart(session: pytest.Session) -> None:
    tmp = tempfile.gettempdir()
    ratio, free = usage_of(os.statvfs(tmp))
    if ratio * 100 >= DISK_LIMIT_PERCENT:
        pytest.exit(f"the file system of {tmp} is {ratio * 100:.1f}% used ({free >> 20} MiB free): brokers refuse "
                    f"writes at 90%, so the suite would fail; free space first (old pytest-of-* folders in {tmp}?)",
                    returncode=3)
