"""Failures on a real standalone cluster (a master and two worker JVMs on loopback): a killed
executor mid-training is survived with max_restarts and the exact result; without restarts it is a
clear error within a bounded time with no rank process left.  Runs in the standalone pass
(``make test-standalone``, part of ``make test``)."""

import time

import pytest
import torch

from sparkml_dist import WorkerError
from sparkml_dist.runner import BarrierRunner, checkpoint
from tests import runner_helpers as h
from tests.conftest import IS_STANDALONE
from tests.runner_checks import assert_no_rank_left

pytestmark = pytest.mark.skipif(not IS_STANDALONE, reason="needs the standalone cluster pass")


def test_killed_executor_restarts_from_the_checkpoint_with_the_exact_result(spark, tmp_path):
    reference = BarrierRunner(-2, timeout=120, checkpoint_dir=str(tmp_path / "ref")).run(h.train_with_checkpoints)
    lines = []
    t = time.time()
    out = BarrierRunner(2, timeout=400, max_restarts=1, checkpoint_dir=str(tmp_path / "run"),
                        log_sink=lines.append).run(h.train_with_checkpoints, crash_at=7,
                                                   crash_once_marker=str(tmp_path / "killed"),
                                                   crash_how="kill_executor")
    took = time.time() - t
    assert (tmp_path / "killed").exists() and out["resumed_from"] == 6
    assert torch.equal(out["weight"], reference["weight"]) and torch.equal(out["bias"], reference["bias"])
    assert any("attempt 1 failed" in ln for ln in lines)
    assert took < 300, took
    print(f"kill -> restarted and finished in {took:.1f}s")
    assert_no_rank_left(within=30)


def test_killed_executor_without_restarts_fails_fast_and_leaves_nothing(spark, tmp_path):
    t = time.time()
    with pytest.raises(WorkerError):
        BarrierRunner(2, timeout=300, checkpoint_dir=str(tmp_path / "run")).run(
            h.train_with_checkpoints, crash_at=4, crash_how="kill_executor")
    took = time.time() - t
    assert took < 120, took
    assert checkpoint.latest_step(str(tmp_path / "run")) == 2  # what a later run would resume from
    assert_no_rank_left(within=30)
