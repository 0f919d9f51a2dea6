"""The several-hosts pass: after every test no rank process and no new work directory is left;
after the pass, nothing of the clusters (namespaces, links, /etc/netns entries, Spark or rank
processes, work directories) — checked here and failing the run when something is."""

import glob
import os
import tempfile

import pytest

from tests.support.runner_checks import assert_no_rank_left


def _work_dirs() -> set:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "sparkml_dist-*")))


@pytest.fixture(autouse=True)
def nothing_left_behind():
    before = _work_dirs()
    yield
    assert_no_rank_left(within=30)
    left = _work_dirs() - before
    assert not left, f"work directories left behind: {sorted(left)}"


def pytest_sessionfinish(session, exitstatus):
    from tests.support.hosts import Hosts

    left = [item for cluster in Hosts.built for item in cluster.leftovers()]
    if left:
        print(f"\nthe test hosts left behind: {left}")
        session.exitstatus = 1
