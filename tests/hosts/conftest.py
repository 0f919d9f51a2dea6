"""The several-hosts pass: after every test no rank process and no new work directory is left;
after the pass, nothing of the clusters (namespaces, links, /etc/netns entries, Spark or rank
processes, work directories) — checked here and failing the run when something is.  The pass has
a temporary directory of its own (``PASS_TMP``), so another pass beside it leaves nothing here."""

import glob
import os
import re
import shutil
import tempfile

import pytest

from tests.conftest import IS_HOSTS
from tests.support.runner_checks import assert_no_rank_left

# The pass's own temporary directory, inherited by every process it starts (Spark's daemons, the
# executors, the ranks, whose work directories land there): what the checks find left is this
# pass's own, whatever runs beside it (`make test` runs other passes beside this one).
PASS_TMP = tempfile.mkdtemp(prefix="hosts-pass-") if IS_HOSTS else None
if PASS_TMP:
    os.environ["TMPDIR"] = PASS_TMP
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again


KEPT = re.compile(
    r"sparkml_dist-(work|staging|pool)-\d+$"
)  # per-user roots kept by design (workdirs, staging, warm pools)


def _work_dirs() -> set:
    found = glob.glob(os.path.join(tempfile.gettempdir(), "sparkml_dist-*"))
    return {p for p in found if not KEPT.match(os.path.basename(p))}


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
    if PASS_TMP:
        shutil.rmtree(PASS_TMP, ignore_errors=True)
