"""The streamed data path through a real run: the samples of every global step do not depend on the
world size, and a run killed mid-epoch resumes at the next unseen batch on the same or fewer ranks."""

import glob

import pytest

from sparkml_dist import WorkerError
from sparkml_dist.runner import BarrierRunner
from tests.conftest import masters
from tests.support import stream_helpers as sh


@pytest.fixture(scope="module")
def ids(spark):
    return spark.range(0, 200).selectExpr("id", "id * 0.5 AS x").repartition(3)


def _per_step(out):
    return [sorted(sum((rank[s] for rank in out), [])) for s in range(len(out[0]))]


@masters("local")
def test_every_global_step_trains_on_the_same_samples_with_1_2_or_4_ranks(ids):
    steps = {
        np_: _per_step(
            BarrierRunner(np_, timeout=240).run_with_data(ids, sh.step_ids, 16, streams=4, return_all=True)
        )
        for np_ in (-1, 2, -4)
    }
    assert steps[-1] == steps[2] == steps[-4] and len(steps[2]) == 13  # ceil(50 / (16 / 4))
    assert set(sum(steps[2], [])) == set(range(200))


def _seen(log_dir):
    lines = []
    for path in glob.glob(f"{log_dir}/*.ids"):
        lines += open(path).read().split()
    return sorted(int(i) for i in lines)


@masters("local", "cluster")
def test_a_run_killed_mid_epoch_resumes_at_the_next_unseen_batch(ids, tmp_path):
    logs = tmp_path / "same"
    logs.mkdir()
    runner = BarrierRunner(2, timeout=300, max_restarts=1, checkpoint_dir=str(tmp_path / "ckpt-same"))
    out = runner.run_with_data(ids, sh.ids_with_a_crash, str(logs), 9, streams=4, return_all=True)
    assert [o["resumed_at"] for o in out] == [10, 10] and all(o["restored"] for o in out)
    assert _seen(logs) == list(range(200))  # every sample of the epoch exactly once, over both attempts


@masters("local")
def test_a_run_killed_mid_epoch_resumes_on_fewer_ranks(ids, tmp_path):
    logs, ckpt = tmp_path / "fewer", str(tmp_path / "ckpt-fewer")
    logs.mkdir()
    with pytest.raises(WorkerError, match="exited with code 3"):
        BarrierRunner(2, timeout=300, checkpoint_dir=ckpt).run_with_data(
            ids, sh.ids_with_a_crash, str(logs), 6, streams=4
        )
    out = BarrierRunner(1, timeout=300, checkpoint_dir=ckpt).run_with_data(
        ids, sh.ids_with_a_crash, str(logs), streams=4
    )
    assert out == {"resumed_at": 7, "restored": True, "world": 1}
    assert _seen(logs) == list(range(200))
