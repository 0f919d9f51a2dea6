"""The suite's leak check counts the rank processes this pytest run started, and only those: it
fails when a test leaves one behind, and passes while another suite's ranks run beside it."""

import os
import subprocess
import sys

import pytest

from tests.support.runner_checks import RANK_MARK, SUITE_ENV, assert_no_rank_left


def _fake_rank(suite):
    code = f"import time; time.sleep(60)  # {RANK_MARK}"
    return subprocess.Popen([sys.executable, "-c", code], env={**os.environ, SUITE_ENV: suite})


def test_a_rank_left_behind_by_this_run_fails_the_check_and_another_suites_rank_does_not():
    ours = _fake_rank(os.environ[SUITE_ENV])
    theirs = _fake_rank("another-suite-running-beside-this-one")
    try:
        with pytest.raises(AssertionError, match="rank processes survived the run"):
            assert_no_rank_left(within=1.0)
        ours.kill()
        ours.wait()
        assert_no_rank_left(within=5.0)  # the other suite's rank is still running: not ours
        assert theirs.poll() is None
    finally:
        for p in (ours, theirs):
            p.kill()
            p.wait()
