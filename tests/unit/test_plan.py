"""The memory rule and the concurrency planner (no Spark)."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from sparkml_dist import ConfigurationError, InsufficientResourcesError
from sparkml_dist.plan import ClusterMemory, model_bytes, parameter_count, plan_concurrency


def test_formula_follows_the_seeds():
    torch = pytest.importorskip("torch")
    net = torch.nn.Linear(10, 5)  # 55 parameters
    assert parameter_count(net) == 55
    assert model_bytes(net) == 55 * 4
    assert model_bytes(net, precision="fp16") == 55 * 2
    assert model_bytes(net, precision="fp64", backprop=True) == 55 * 8 * 2
    assert model_bytes(1000, backprop=True, batch_size=32, steps=10) == 1000 * 4 * 2 * 32 * 10


def test_fitted_estimators_are_counted_by_the_values_they_hold():
    from sklearn.linear_model import LogisticRegression
    from sklearn.tree import DecisionTreeClassifier

    X = np.random.default_rng(0).normal(size=(300, 6))
    y = (X[:, 0] > 0).astype(int)
    lr = LogisticRegression().fit(X, y)
    assert parameter_count(lr) >= lr.coef_.size + lr.intercept_.size
    small = DecisionTreeClassifier(max_depth=2).fit(X, y)
    deep = DecisionTreeClassifier().fit(X, y + (X[:, 1] > 0))
    assert parameter_count(deep) > parameter_count(small)  # more nodes, more values


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(precision="int8"), "precision must be one of"),
        (dict(batch_size=0), "batch_size must be an integer >= 1"),
        (dict(steps=1.5), "steps must be an integer >= 1"),
    ],
)
def test_bad_formula_inputs_name_the_parameter(kwargs, match):
    with pytest.raises(ConfigurationError, match=match):
        model_bytes(10, **kwargs)
    with pytest.raises(ConfigurationError, match="cannot count the parameters"):
        parameter_count("a model")


def test_planner_divides_memory_and_caps_by_slots():
    cluster = ClusterMemory(
        executors=3, cores_per_executor=4, task_cpus=1, python_bytes_per_executor=10 << 30, source="test"
    )
    p = plan_concurrency(None, 3 << 30, cluster=cluster)  # 3 GiB models: 3 fit in 10 GiB
    assert (p.models_per_executor, p.slots_per_executor, p.concurrency) == (3, 4, 9)
    assert plan_concurrency(None, 1 << 20, cluster=cluster).concurrency == 12  # slots bound it
    assert plan_concurrency(None, 1 << 20, max_concurrent=5, cluster=cluster).concurrency == 5
    with pytest.raises(
        InsufficientResourcesError, match=r"11264\.0 MiB.*10240\.0 MiB.*spark.executor.pyspark.memory"
    ):
        plan_concurrency(None, 11 << 30, cluster=cluster)
    with pytest.raises(ConfigurationError, match="max_concurrent must be an integer >= 1"):
        plan_concurrency(None, 1, max_concurrent=0, cluster=cluster)


MEASURE = textwrap.dedent("""
    import json, torch
    def mb(key):
        for line in open("/proc/self/status"):
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    torch.set_num_threads(1)
    warm = torch.nn.Linear(64, 64)   # the first forward/backward loads kernels: not the model's memory
    torch.optim.SGD(warm.parameters(), lr=0.01).zero_grad()
    warm(torch.randn(1, 64)).sum().backward()
    torch.optim.SGD(warm.parameters(), lr=0.01).step()
    base = mb("VmRSS")
    open("/proc/self/clear_refs", "w").write("5")
    net = torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.Linear(2048, 2048))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    x = torch.randn(1, 2048)
    net(x).sum().backward()          # gradients: one more copy of the parameters
    opt.step()
    print(json.dumps({"peak": mb("VmHWM") - base}))
""")


def test_estimate_is_within_a_factor_of_the_measured_peak():
    """A two-layer MLP trained by backprop, batch 1: the formula vs the process's peak growth."""
    torch = pytest.importorskip("torch")
    import json

    net = torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.Linear(2048, 2048))
    estimate = model_bytes(net, precision="fp32", backprop=True, batch_size=1)
    out = subprocess.run([sys.executable, "-c", MEASURE], capture_output=True, text=True, check=True)
    peak = json.loads(out.stdout.strip().splitlines()[-1])["peak"]
    assert 0.75 <= peak / estimate <= 1.5, (peak, estimate)  # the stated factor: within 1.5x


class FakeCuda:
    """torch.cuda on a machine with GPUs of these sizes (no GPU here: the one thing mocked)."""

    def __init__(self, *totals):
        self.totals = totals

    def is_available(self):
        return True

    def device_count(self):
        return len(self.totals)

    def mem_get_info(self, i):
        return self.totals[i] // 2, self.totals[i]


def test_gpu_memory_refuses_a_rank_share_that_cannot_fit_one_gpu(monkeypatch):
    import torch

    from sparkml_dist.plan import check_fits_gpu, gpu_bytes
    from sparkml_dist.runner import BarrierRunner

    monkeypatch.setattr(torch, "cuda", FakeCuda(80 << 30, 40 << 30))
    assert gpu_bytes() == (40 << 30, "torch.cuda.mem_get_info")  # the smallest GPU a rank may get
    assert gpu_bytes(gpus=["0"]) == (80 << 30, "torch.cuda.mem_get_info")
    assert gpu_bytes(on_this_machine=False) is None  # the driver's GPUs say nothing of executors'
    check_fits_gpu(30 << 30, gpu_bytes())
    with pytest.raises(InsufficientResourcesError, match=r"needs about 50.00 GiB but a GPU has 40.00 GiB"):
        check_fits_gpu(50 << 30, gpu_bytes())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(InsufficientResourcesError, match=r"stages=k"):  # refused before any process starts
        BarrierRunner(-2, use_gpu=True, model_bytes=50 << 30).run(print)


def test_gpu_members_follow_the_documents_rule():
    """N_total = executors x min(slots by CPU, GPUs / GPU per task, GPUs x members per GPU)."""
    from sparkml_dist.plan import gpu_members

    gib = 1 << 30
    # 4 executors of 8 slots and 2 GPUs, a task per GPU: the GPUs bound it (4 x 2 = 8)
    p = gpu_members(4, 8, 2, 1.0, 16 * gib, 6 * gib)
    assert (p.concurrency, p.task_gpu_amount) == (8, 1.0)
    # tasks of 0.25 GPU share one four by four, but only 2 members of 6 GiB fit 16 GiB: ask 0.5
    p = gpu_members(4, 8, 2, 0.25, 16 * gib, 6 * gib)
    assert (p.concurrency, p.task_gpu_amount) == (16, 0.5)
    assert (
        "4 tasks by GPU (2 GPUs, 0.5 GPU per task; 2 member(s) of 6.0 GiB in a GPU of 16.0 GiB)"
        in p.summary()
    )
    # small members: the CPU slots bound it
    assert gpu_members(2, 3, 2, 0.25, 16 * gib, gib).concurrency == 6
    # unknown GPU memory: the plan says so, and keeps the cluster's share
    p = gpu_members(1, 4, 2, 0.5, None, 6 * gib, "set spark.sparkml_dist.gpu.memory")
    assert not p.memory_known and p.concurrency == 4
    assert "GPU memory unknown (set spark.sparkml_dist.gpu.memory)" in p.summary()


def test_gpu_members_refuse_what_no_gpu_holds():
    from sparkml_dist.plan import gpu_members

    with pytest.raises(
        InsufficientResourcesError, match=r"20.00 GiB of GPU memory \(gpuMemoryPerMember\).*16.00 GiB"
    ):
        gpu_members(1, 4, 2, 1.0, 16 << 30, 20 << 30)
    with pytest.raises(InsufficientResourcesError, match="executors have no GPU"):
        gpu_members(1, 4, 0, 1.0, None, 1)
