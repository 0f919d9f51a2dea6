"""Real GPU checks (NCCL, pinning, feeding, planning, pipelines): run where CUDA is, no Spark JVM.

Ranks run as local processes (np < 0), as on a GPU box without Java; skipped elsewhere.
"""

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA device on this machine: tests/gpu runs on a GPU machine (np < 0, no Spark JVM needed)",
)

from sparkml_dist import InsufficientResourcesError  # noqa: E402
from sparkml_dist.distributor import TorchDistributor  # noqa: E402
from sparkml_dist.runner import BarrierRunner  # noqa: E402
from tests.support import gpu_helpers as g  # noqa: E402
from tests.support import parallel_helpers as ph  # noqa: E402
from tests.support.runner_checks import assert_no_rank_left  # noqa: E402


def gpus():
    return torch.cuda.device_count()


def test_each_local_rank_gets_its_own_gpu_and_nccl():
    n = gpus()
    out = BarrierRunner(-n, use_gpu=True, timeout=300).run(g.nccl_allreduce_and_where, return_all=True)
    # torchrun's rule: every rank sees the machine's GPUs, LOCAL_RANK (= its device) picks its own
    assert all(
        o["backend"] == "nccl" and o["device"] == f"cuda:{i}" and o["count"] == n for i, o in enumerate(out)
    )
    assert len({o["uuid"] for o in out}) == n  # distinct physical GPUs
    assert {o["sum"] for o in out} == {n * (n + 1) / 2}
    too_many = f"{n + 1} ranks need {n + 1} GPUs, but this machine shows {n}"
    with pytest.raises(InsufficientResourcesError, match=too_many):
        BarrierRunner(-(n + 1), use_gpu=True).run(g.nccl_allreduce_and_where)
    assert_no_rank_left()


def test_ddp_trains_on_batches_copied_to_the_gpu():
    out = BarrierRunner(-gpus(), use_gpu=True, timeout=300).run(g.ddp_on_gpu_with_shard_batches)
    assert out["devices"] == ["cuda:0"] and out["last"] < out["first"] / 2


def test_a_single_process_on_its_gpu_outlives_start_timeout():
    out = BarrierRunner(-1, use_gpu=True, start_timeout=2, timeout=120).run(g.one_process_on_its_gpus, 5)
    assert out == {"sum": 1024.0, "gpus": 1}


def test_a_model_larger_than_one_gpu_is_refused_before_launching():
    total = torch.cuda.mem_get_info(0)[1]
    with pytest.raises(InsufficientResourcesError, match="a GPU has"):
        BarrierRunner(-1, use_gpu=True, model_bytes=2 * total).run(g.one_process_on_its_gpus, 0)


def test_torch_distributor_local_mode_on_the_drivers_gpus():
    distributor = TorchDistributor(num_processes=gpus(), local_mode=True, use_gpu=True)
    out = distributor.run(g.nccl_allreduce_and_where)
    assert out["backend"] == "nccl"


@pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="a pipeline of 2 stages needs 2 GPUs (NCCL: one rank per GPU)"
)
def test_pipeline_stages_on_two_gpus_train_like_one_process():
    state, losses = ph.train_unsplit(4, 32)
    out = BarrierRunner(-2, use_gpu=True, timeout=300).run(ph.train_pipeline, 4, 32, 2, "interleaved")
    assert max((out["state"][k] - state[k]).abs().max().item() for k in state) <= 1e-4  # TF32 aside
