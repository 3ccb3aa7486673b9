"""Suite-wide checks made once, before any test runs."""

from __future__ import annotations

import os
import tempfile

import pytest

from cometmq.store.message_store import usage_of

#: brokers refuse writes at diskSpaceWarningLevelRatio (90 % by default); the suite's brokers write to the temp
#: folder, so a run started above this share would fail by the hundred with "disk full" instead of saying why
DISK_LIMIT_PERCENT = 85

#: the CLI's error boxes (rich) wrap at the terminal's width, and under pytest-xdist temp paths are longer
#: (…/popen-gw0/…): a path cut in two would not be found in a command's message. Tests wanting a width set their own.
os.environ["COLUMNS"] = "300"


def pytest_sessionstart(session: pytest.Session) -> None:
    tmp = tempfile.gettempdir()
    ratio, free = usage_of(os.statvfs(tmp))
    if ratio * 100 >= DISK_LIMIT_PERCENT:
        pytest.exit(f"the file system of {tmp} is {ratio * 100:.1f}% used ({free >> 20} MiB free): brokers refuse "
                    f"writes at 90%, so the suite would fail; free space first (old pytest-of-* folders in {tmp}?)",
                    returncode=3)


#: pytest-xdist (scripts/test runs two workers, ``--dist loadgroup``): each group runs whole on one worker, in order.
#: spark and interop share session fixtures (a SparkSession, the official clients' environments); the rest are the
#: multi-process clusters (brokers, controllers, etcd, proxies killed and restarted under time bounds), kept one at a
#: time so two of them never share the 2 cores; the other tests spread over both workers.
#: Of tests/spark, only the tests that start a JVM (the session's SparkSession, a Spark Connect server, a Spark
#: cluster) are in the group: its worker is the suite's longest, and the unit, wire and broker-only tests there
#: spread like the rest.
_GROUPS = {"spark": "spark", "interop": "interop", "chaos": "clusters", "ha": "clusters", "controller": "clusters",
           "test_cli_cluster.py": "clusters", "test_cli_controller.py": "clusters", "test_containers.py": "clusters"}
_JVM_FIXTURES = frozenset({"spark", "connect", "cluster"})


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which reads the marks into the node ids it schedules by
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = os.path.dirname(__file__)
    for item in items:
        top = os.path.relpath(str(item.path), here).split(os.sep)[0]
        group = _GROUPS.get(top)
        if group == "spark" and _JVM_FIXTURES.isdisjoint(getattr(item, "fixturenames", ())):
            continue
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Stop a worker whose pytest-xdist did not apply the groups (it marks a grouped test's node id ``@group``):
    with pytest 9.2 it silently did not, and the suite ran two Spark clusters and two multi-process clusters at once
    on the 2 cores, past its time budget."""
    if not session.config.getoption("loadgroup", default=False):  # (set on xdist's workers under --dist loadgroup)
        return
    lost = [item.nodeid for item in session.items
            if item.get_closest_marker("xdist_group") is not None and "@" not in item.nodeid.rpartition("]")[2]]
    if lost:
        raise pytest.UsageError(f"pytest-xdist ignored the xdist_group marks of {len(lost)} tests (e.g. {lost[0]}): "
                                f"pytest {pytest.__version__} with this pytest-xdist; see pyproject.toml's test extra")
