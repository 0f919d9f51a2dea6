"""sparkml_dist.parallel: pipeline stages over local rank processes (np < 0), no Spark."""

import re

import pytest
import torch

from sparkml_dist import ConfigurationError, InsufficientResourcesError
from sparkml_dist._spark_env import ClusterMemory
from sparkml_dist.parallel import partition
from sparkml_dist.plan import model_bytes, plan_concurrency
from sparkml_dist.runner import BarrierRunner, checkpoint
from tests.support import parallel_helpers as ph
from tests.support.runner_checks import assert_no_rank_left

pytestmark = pytest.mark.slow  # starts rank processes or waits on timeouts: not in make test-fast

STEPS, ROWS = 5, 32


@pytest.fixture(scope="module")
def unsplit():
    state, losses = ph.train_unsplit(STEPS, ROWS)
    model = ph.build_model()
    model.load_state_dict(state)
    return state, losses, model


def max_diff(a, b):
    assert list(a) == list(b)  # the unsplit model's keys, in its order
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.mark.parametrize(
    "np_, stages, schedule, balance, replicas",
    [
        (2, 2, "simple", "compute", 1),
        (2, 2, "interleaved", "memory", 1),
        (2, 4, "interleaved", "compute", 1),  # two stages per rank: interleaved 1F1B
        (2, 4, "simple", [1, 3, 2, 2], 1),  # looped fill-drain, an explicit split
        (4, 2, "simple", "memory", 2),  # 2 stages x 2 data-parallel replicas
        (4, 2, "interleaved", "compute", 2),
    ],
)
def test_pipeline_trains_exactly_like_one_process(unsplit, np_, stages, schedule, balance, replicas):
    state, losses, model = unsplit
    out = BarrierRunner(-np_, timeout=180).run(
        ph.train_pipeline,
        STEPS,
        ROWS,
        stages,
        schedule,
        balance=balance,
        data_parallel=replicas,
        return_all=True,
    )
    assert max_diff(state, out[0]["state"]) <= 1e-5
    assert all(o["state"] is None for o in out[1:])  # the whole model only on rank 0
    for o in out:  # the mini-batch's mean loss and the model's predictions on every rank
        assert o["losses"] == pytest.approx(losses, abs=1e-5)
        assert torch.allclose(o["predict"], model(ph.batch(999, 10)[0]), atol=1e-5)
    splits = {tuple(o["split"]) for o in out}
    assert len(splits) == 1  # the same split on every rank
    split = splits.pop()
    assert len(split) == stages and split[0][0] == 0 and split[-1][1] == ph.LAYERS
    assert all(a < b and b == c for (a, b), (c, _) in zip(split, split[1:] + ((split[-1][1], 0),)))
    if isinstance(balance, list):
        assert [b - a for a, b in split] == balance
    # each rank holds only its stages: the pipeline ranks of one replica hold the model once
    per_replica = sum(o["params_here"] for o in out[: np_ // replicas])
    assert per_replica == sum(p.numel() for p in model.parameters())
    assert_no_rank_left()


@pytest.mark.parametrize("balance, np_, replicas", [("memory", 2, 1), ("compute", 4, 2)])
def test_a_model_built_on_the_meta_device_is_materialised_stage_by_stage(unsplit, balance, np_, replicas):
    state, losses, _ = unsplit
    out = BarrierRunner(-np_, timeout=180).run(
        ph.train_pipeline, STEPS, ROWS, 2, "interleaved", balance=balance, data_parallel=replicas, meta=True
    )
    assert max_diff(state, out["state"]) <= 1e-5
    assert out["losses"] == pytest.approx(losses, abs=1e-5)


def test_replicas_start_from_the_same_weights_whatever_each_rank_initialised():
    # a meta model is initialised by each rank on its own (reset_parameters): replicas must agree
    out = BarrierRunner(-4, timeout=180).run(
        ph.train_pipeline, 2, ROWS, 2, "simple", data_parallel=2, meta=True, load_reference=False,
        return_all=True,
    )  # fmt: skip
    for r in (0, 1):  # pipeline rank r of replica 0 and of replica 1 hold the same stage
        mine, twin = out[r]["local"], out[r + 2]["local"]
        assert list(mine) == list(twin) and all(torch.equal(mine[k], twin[k]) for k in mine)


def test_memory_balance_puts_the_heavy_layers_apart():
    # a wide layer and many thin ones: memory balance isolates the wide one
    assert partition([100, 1, 1, 1, 1, 1, 1, 1], 2) == [1, 7]
    assert partition([1, 1, 1, 1, 1, 1, 1, 100], 2) == [7, 1]
    assert partition([3, 3, 3, 3], 4) == [1, 1, 1, 1]


def test_a_resumed_pipeline_ends_with_the_weights_of_an_uninterrupted_run(tmp_path):
    reference = ph.train_unsplit_adam(steps=8)
    runner = BarrierRunner(-2, timeout=240, max_restarts=1, checkpoint_dir=str(tmp_path / "ck"))
    out = runner.run(ph.train_pipeline_with_checkpoints, steps=8, every=2, crash_at=5)
    assert out["resumed_from"] == 4  # the step-3 checkpoint: model and Adam state of both stages
    assert max_diff(reference, out["state"]) <= 1e-5
    saved = checkpoint.load(str(tmp_path / "ck"))["pipe"]
    assert set(saved["optimizer"]["state"]) == {k for k in reference if k.endswith(("weight", "bias"))}
    assert_no_rank_left()


def test_bad_arguments_name_the_parameter_before_any_collective():
    cases = [
        ({"stages": 3}, "stages=3 must be a multiple of the pipeline ranks"),
        ({"stages": 9}, "stages=9 is more than the model's 8 layers"),
        ({"microbatches": 5}, "microbatches=5 must divide the mini-batch"),
        ({"microbatches": 1}, "microbatches=1 must be >= stages"),
        ({"data_parallel": 3}, "data_parallel=3 must divide the world size"),
        ({"schedule": "zigzag"}, "schedule must be one of"),
        ({"balance": "speed"}, "balance must be one of"),
        ({"balance": [4, 3]}, "balance as a list gives the layers of each stage"),
        ({"model": "not_sequential"}, "model must be a torch.nn.Sequential or a module with a `blocks`"),
        ({"model": "params_outside_blocks"}, r"model: Net holds parameters outside its `blocks` \(head"),
    ]
    out = BarrierRunner(-2, timeout=120).run(ph.bad_pipeline_args, [c for c, _ in cases])
    for (case, expected), got in zip(cases, out):
        assert got is not None, case
        assert got["type"] == "ConfigurationError", (case, got)
        assert re.search(expected, got["message"]), (case, got)
        assert not got["initialized"], case  # refused before any process group or collective


def test_no_object_collective_runs_no_unpickling_on_the_wire():
    out = BarrierRunner(-2, timeout=120).run(ph.no_pickle_on_the_wire, return_all=True)
    assert [o["has_state"] for o in out] == [True, False]


def test_a_model_too_big_for_a_rank_is_refused_whole_and_trains_split():
    model = ph.build_model(layers=16, width=256)
    whole = model_bytes(model, backprop=True)
    half = model_bytes(model, backprop=True, stages=2)
    assert half <= 0.55 * whole  # the largest of two balanced stages
    cap = ClusterMemory(1, 2, 1, (whole + half) // 2, "a test cap")
    with pytest.raises(InsufficientResourcesError, match="one model needs about"):
        plan_concurrency(None, whole, cluster=cap)
    assert plan_concurrency(None, half, cluster=cap).models_per_executor == 1
    assert model_bytes(1001, stages=2) == 501 * 4
    with pytest.raises(ConfigurationError, match="stages must be an integer >= 1"):
        model_bytes(model, stages=0)
