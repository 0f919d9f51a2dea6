"""Reduction servers (``BarrierRunner(np, comm={"reduction_servers": k})``): CPU ranks beside the
workers that sum DDP's buckets, on real gloo ranks (local processes of the runner, np < 0). The
same answer as one process is the truth matrix's row (tests/spark/test_truth.py)."""

import re

import pytest

from sparkml_dist.errors import ConfigurationError, WorkerError
from sparkml_dist.runner import BarrierRunner
from tests.support import comm_helpers as ch

pytestmark = pytest.mark.slow


def test_the_servers_sum_every_bucket_and_each_worker_sends_each_gradient_byte_once():
    """3 workers, 2 servers, 2 KB buckets: several buckets a step, in DDP's order on every rank.
    Slow (~10 s): five rank processes."""
    runner = BarrierRunner(-3, comm={"reduction_servers": 2}, timeout=180, log_ranks="none")
    assert runner.world_size == 5
    out = runner.run(ch.reduced_by_servers, 8, 16, 0.002)
    assert out["diff"] < 1e-5  # = one process stepping on the 3 workers' rows at once
    assert out["buckets"] == out["summed"] > 8  # every bucket DDP handed over came back summed
    # each gradient byte sent once (a ring all-reduce sends 2 (n - 1) / n of them: 1.33 at 3)
    assert out["bytes"] == 8 * out["params"] * 4


def test_a_bucket_of_several_chunks_a_server_is_summed_with_its_next_chunks_awaited_ahead():
    """One 100 MB bucket cap, 2.4 M gradients, 1 server: the shard travels in two 4 MiB chunks and
    a third, the server awaiting the next while it sums one. 2 steps within 1e-4 of one process
    (a layer 300,000 wide: DDP's ring measured 2.7e-5, the servers the same). Slow (~10 s)."""
    runner = BarrierRunner(-3, comm={"reduction_servers": 1}, timeout=180, log_ranks="none")
    out = runner.run(ch.reduced_by_servers, 2, 16, 100, None, 300_000)
    assert out["params"] > 2 * (4 << 20) / 4  # more than two chunks' float32s
    assert out["diff"] < 1e-4 and out["buckets"] == out["summed"] == 2
    assert out["bytes"] == 2 * out["params"] * 4


@pytest.mark.parametrize("compression,tolerance", [("fp16", 1e-3), ("bf16", 5e-3)])
def test_half_precision_shards_halve_the_bytes_and_the_servers_add_them_in_float32(compression, tolerance):
    """fp16/bf16 on the wire (bf16 on gloo too: the servers add, not gloo): each share rounded
    once, the sum in float32, rounded once on the way back. Stated tolerance: the weights within
    1e-3 (fp16; measured 2.4e-4, where DDP's fp16 ring gave 4.1e-4) and 5e-3 (bf16; 1.8e-3) of one
    process's float32 steps (8 SGD steps with momentum). Slow (~10 s): four ranks."""
    comm = {"reduction_servers": 1, "compression": compression}
    out = BarrierRunner(-3, comm=comm, timeout=180, log_ranks="none").run(ch.reduced_by_servers, 8, 16, 0.002)
    assert 1e-6 < out["diff"] < tolerance, out["diff"]  # rounded (not float32's answer), yet close
    assert out["buckets"] == out["summed"] > 8
    assert out["bytes"] == 8 * out["params"] * 2  # 2 bytes a gradient: half of float32's


def test_servers_beside_a_function_that_never_uses_them_end_with_the_run_and_say_why():
    """The servers wait for workers that never come, and end when rank 0's function returns."""
    lines = []
    runner = BarrierRunner(
        -2, comm={"reduction_servers": 1}, timeout=120, log_ranks="all", log_sink=lines.append
    )
    assert runner.run(ch.plain_model_beside_servers) == (0, 2)  # the workers' world: no server in it
    assert "reduction server 0: no worker joined" in "".join(lines)


def test_a_killed_server_fails_the_run_naming_it():
    runner = BarrierRunner(-2, comm={"reduction_servers": 2}, timeout=120, log_ranks="none")
    with pytest.raises(WorkerError) as err:
        runner.run(ch.kill_a_server_then_train)
    said = str(err.value)
    assert re.match(r"rank [23] \(reduction server [01]\) was killed by signal 9", said), said


@pytest.mark.parametrize(
    "kwargs,says",
    [
        (dict(backend="horovod"), "reduction_servers is for backend='torch'"),
        (dict(use_gpu=True), "use_gpu=True is not taken with them yet"),
        (dict(comm={"compression": "powersgd"}), "compression='powersgd' is not taken with them"),
        (dict(min_np=1, max_restarts=1), "min_np is not taken with comm={'reduction_servers'"),
        (dict(comm={"reduction_servers": 0}), "reduction_servers must be a positive integer"),
        (dict(comm={"reduction_servers": True}), "reduction_servers must be a positive integer"),
        (dict(comm={"reduction_servers": 10**6}), "must be a positive integer (finite, <= 1024)"),
    ],
)
def test_what_the_servers_do_not_take_is_refused_on_the_driver_naming_it(kwargs, says):
    comm = {"reduction_servers": 2, **kwargs.pop("comm", {})}
    with pytest.raises(ConfigurationError) as info:
        BarrierRunner(-2, comm=comm, **kwargs)
    assert says in str(info.value), str(info.value)


def test_return_all_gives_the_workers_results_in_rank_order():
    runner = BarrierRunner(-2, comm={"reduction_servers": 1}, timeout=120, log_ranks="none")
    assert runner.run(ch.plain_model_beside_servers, return_all=True) == [(0, 2), (1, 2)]  # no server's


def test_elastic_run_beside_servers_is_refused_in_the_rank_naming_the_fix():
    runner = BarrierRunner(-2, comm={"reduction_servers": 1}, timeout=120, log_ranks="none")
    with pytest.raises(WorkerError, match="elastic.run does not form the reduction servers' group again"):
        runner.run(ch.elastic_beside_servers)
