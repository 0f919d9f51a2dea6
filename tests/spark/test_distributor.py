"""The drop-in TorchDistributor: pyspark's documented calls, only the import changed."""

import os

import pytest

from sparkml_dist import ConfigurationError
from sparkml_dist.distributor import TorchDistributor
from tests.conftest import ROOT, masters
from tests.support import runner_helpers as h
from tests.support.runner_checks import assert_no_rank_left


@masters("local", "connect", "cluster")  # what separate executor JVMs can change
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


@masters("local")
def test_lightnings_multi_node_recipe_runs_unchanged_through_the_drop_in(spark):
    """Trainer(devices=1, num_nodes=2), one process per task (local_mode=False), as with pyspark's
    TorchDistributor: each task is a node (LOCAL_RANK 0, GROUP_RANK/NODE_RANK the task's number)."""
    pytest.importorskip("lightning")
    dist = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False, timeout=300)
    outs = dist._runner(spark).run(h.lightning_multinode, return_all=True)
    assert [(o["global_rank"], o["node_rank"], o["local_rank"]) for o in outs] == [(0, 0, 0), (1, 1, 0)]
    assert {o["world_size"] for o in outs} == {2}
    assert outs[0]["weight"] == outs[1]["weight"]  # DDP kept the replicas equal
    assert_no_rank_left()
