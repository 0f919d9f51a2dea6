"""The drop-in TorchDistributor: pyspark's documented calls, only the import changed."""

import os

import pytest

from sparkml_dist import ConfigurationError
from sparkml_dist.distributor import TorchDistributor
from tests.conftest import ROOT
from tests.support import runner_helpers as h
from tests.support.runner_checks import assert_no_rank_left


def test_the_documented_call_runs_a_function_on_barrier_tasks(spark):
    out = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(h.allreduce_rank_sum, 7)
    assert out["sum"] == 3.0 and out["x"] == 7  # rank 0's value: ranks 1 + 2 all-reduced
    assert out["env"]["WORLD_SIZE"] == "2" and out["env"]["RANK"] == "0"
    assert_no_rank_left()


def test_a_script_path_runs_with_its_command_line_and_returns_none(spark):
    lines = []
    dist = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False, log_sink=lines.append)
    assert dist.run(os.path.join(ROOT, "examples", "ddp_train.py"), "--steps", "5") is None
    assert "after 5 steps on 2 ranks" in "".join(lines)
    with pytest.raises(ConfigurationError, match="takes command-line arguments only"):
        dist.run(os.path.join(ROOT, "examples", "ddp_train.py"), steps=5)
    with pytest.raises(ConfigurationError, match="no training script at"):
        dist.run("no/such/train.py")
