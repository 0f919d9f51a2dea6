"""Communication settings (sparkml_dist.parallel.comm) and DiLoCo (sparkml_dist.parallel.diloco)
on real gloo ranks: local processes of the runner (np < 0)."""

import math

import pytest

from sparkml_dist.runner import BarrierRunner
from tests.support import comm_helpers as ch

pytestmark = pytest.mark.slow


def test_accumulate_k_all_reduces_once_per_k_micro_steps_and_equals_one_big_step():
    out = BarrierRunner(-2, timeout=120).run(ch.accumulation, 4, return_all=True)
    for o in out:
        assert o["lasts"] == [False, False, False, True]
        assert o["reduced"] == 1  # one bucket (a small model), all-reduced once for 4 micro-steps
        assert o["diff"] < 1e-5  # = one step of one process on the 2 x 4 micro-batches at once


def _powersgd_bytes(shapes, rank, steps, start):
    """What PowerSGD hands to all-reduce for these parameters: ``start`` plain float32 steps, then
    each step the tensors it does not compress whole, and a (n x rank) P and (m x rank) Q factor
    of each n x m matrix worth compressing (n * m > 2 (n + m) rank, torch's rule)."""
    plain = sum(4 * math.prod(s) for s in shapes)
    low = 0
    for s in shapes:
        n, m = s[0], math.prod(s[1:]) if len(s) > 1 else 1
        r = min(n, m, rank)
        low += 4 * (n + m) * r if len(s) > 1 and n * m > 2 * (n + m) * r else 4 * n * m
    return start * plain + (steps - start) * low


@pytest.mark.parametrize("compression", ["fp16", "powersgd"])
def test_compressed_gradients_train_send_what_they_say_and_powersgd_survives_a_resume(compression):
    resume = 20 if compression == "powersgd" else None
    out = BarrierRunner(-2, timeout=180).run(ch.compressed, compression, 60, resume, return_all=True)
    for o in out:
        assert o["last"] < 0.5 * o["first"], o  # it trains
        params = sum(math.prod(s) for s in o["shapes"])
        if compression == "fp16":  # float16 on the wire, 2 bytes a gradient a step, nothing else
            assert o["sent"] == {"float16": 2 * params * 60}, o
        else:  # 3 plain steps, then rank-2 factors of the 16 x 6 weight: 308 bytes a step, not 516
            assert set(o["sent"]) == {"float32"}
            assert o["sent"]["float32"] == _powersgd_bytes(o["shapes"], 2, 60, 3), o
            assert _powersgd_bytes(o["shapes"], 2, 60, 3) < 0.65 * 4 * params * 60
        if resume:  # the error feedback, factors and rng resumed: the same weights as uninterrupted
            assert o["resume_diff"] < 1e-6, o


def test_powersgd_on_gloo_keeps_one_bucket_so_a_wide_model_does_not_deadlock():
    out = BarrierRunner(-2, timeout=120, collective_timeout=60).run(ch.powersgd_wide, 4)
    assert out == {"buckets_reduced": 4}  # one bucket per step: nothing left to wait on another
    text = BarrierRunner(-2, timeout=120).run(ch.powersgd_wide, 1, 5)
    assert "bucket_cap_mb >= 20" in text and "deadlock" in text  # a smaller bucket is refused


def test_bf16_on_gloo_is_refused_naming_the_backend():
    text = BarrierRunner(-2, timeout=120).run(ch.bf16_on_gloo)
    assert text.startswith("ConfigurationError") and "'gloo'" in text and "fp16" in text


def test_diloco_with_one_step_and_a_plain_outer_sgd_is_data_parallel_sgd():
    out = BarrierRunner(-2, timeout=120).run(ch.diloco, 1, 1.0, 0.0, False, return_all=True)
    for o in out:
        assert o["vs_ddp"] < 1e-5
        assert all(equal for _, equal in o["equal_after"])


@pytest.mark.parametrize(
    "kind,says",
    [
        ("model", "tensor 0 'weight': rank 0 has (3, 4) float32, rank 1 has (5, 4) float32"),
        ("sync_every", "sync_every=3 on rank 0 but 4 on rank 1"),
    ],
)
def test_diloco_on_ranks_that_disagree_is_refused_on_every_rank_before_a_step(kind, says):
    out = BarrierRunner(-2, timeout=120).run(ch.diloco_disagreeing, kind, return_all=True)
    assert all(o.startswith("ConfigurationError: DiLoCo") and says in o for o in out), out


def test_diloco_ranks_drift_between_outer_steps_and_meet_at_each():
    out = BarrierRunner(-2, timeout=120).run(ch.diloco, 8, 0.7, 0.9, True, 16, return_all=True)
    for o in out:
        assert [synced for synced, _ in o["equal_after"]] == [i % 8 == 7 for i in range(16)]
        for synced, equal in o["equal_after"]:
            assert equal == synced  # identical after each outer step, different between them
        assert o["syncs"] == 2 and o["bytes"] == 2 * o["params"] * 4  # H=8: 2 all-reduces in 16 steps


def test_the_runs_comm_settings_are_comm_ddps_defaults_and_an_argument_wins():
    runner = BarrierRunner(-2, timeout=120, comm={"accumulate": 3, "bucket_cap_mb": 1, "compression": "fp16"})
    for o in runner.run(ch.run_settings, return_all=True):
        assert o["accumulate"] == 3 and o["lasts"] == [False, False, True] and o["reduced"] == 1
        assert o["bucket_bytes"] == 2**20 and o["same_weights"]
        assert '"compression": "fp16"' in o["env"]
    for o in runner.run(ch.run_settings, 2, return_all=True):  # comm.ddp(model, accumulate=2)
        assert o["accumulate"] == 2 and o["lasts"] == [False, True] and o["bucket_bytes"] == 2**20


def test_horovod_takes_the_same_names_fusion_threshold_cycle_time_fp16_and_accumulation():
    pytest.importorskip("horovod.torch", reason="needs Horovod (make horovod)")
    comm = {"bucket_cap_mb": 1, "cycle_time_ms": 2, "compression": "fp16", "accumulate": 2}
    out = BarrierRunner(-2, backend="horovod", timeout=180, comm=comm).run(
        ch.horovod_settings, 8, return_all=True
    )
    for o in out:
        assert o["env"] == {"HOROVOD_FUSION_THRESHOLD": str(2**20), "HOROVOD_CYCLE_TIME": "2.0"}
        assert o["passes"] == 2 and o["compression"] == "FP16Compressor" and o["same_weights"]
        assert "HOROVOD_FUSION_THRESHOLD" in o["second"] and "comm={...}" in o["second"]  # not silently kept


@pytest.mark.parametrize(
    "backend, comm, says",
    [
        ("torch", {"bucket_size": 4}, "unknown settings ['bucket_size']"),
        ("torch", {"cycle_time_ms": 2}, "['cycle_time_ms'] mean nothing to the torch backend"),
        ("horovod", {"compression": "powersgd"}, "on the horovod backend"),
        ("horovod", {"powersgd_rank": 4}, "mean nothing to the horovod backend"),
        ("torch", {"compression": "bf16"}, "use_gpu=True"),
        ("horovod", {"hierarchical": True}, "hierarchical=True is Horovod's NCCL"),
        ("torch", {"accumulate": 0}, "accumulate must be a positive integer"),
        ("torch", {"bucket_cap_mb": "25"}, "bucket_cap_mb must be a positive number"),
        ("tensorflow", {"accumulate": 2}, "backend='tensorflow' has its own"),
        ("torch", ["fp16"], "comm must be a dict"),
        ("torch", {"bucket_cap_mb": float("nan")}, "bucket_cap_mb must be a positive number (finite"),
        ("torch", {"bucket_cap_mb": float("inf")}, "bucket_cap_mb must be a positive number (finite"),
        ("torch", {"accumulate": 2**40}, "accumulate must be a positive integer (finite, <= 1.04858e+06)"),
        ("horovod", {"cycle_time_ms": 1e9}, "cycle_time_ms must be a positive number (finite, <= 1000)"),
        ("horovod", {"cycle_time_ms": 500.0}, "more than a tenth of collective_timeout=2 s"),
    ],
)
def test_a_comm_setting_the_backend_cannot_take_is_refused_on_the_driver_naming_it(backend, comm, says):
    from sparkml_dist.errors import ConfigurationError
    from sparkml_dist.runner import backends, comm_settings

    with pytest.raises(ConfigurationError, match=None) as info:
        comm_settings.check(comm, backends.get(backend), use_gpu=False, collective_timeout=2.0)
    assert says in str(info.value)
    torch = backends.get("torch")
    assert comm_settings.check(None, torch, False) == {} and comm_settings.rank_env({}, torch) == ()


@pytest.mark.parametrize(
    "backend,env,says",
    [
        ("torch", {"A=B": "1"}, "'A=B' is not a variable name"),
        ("torch", {"A\x00B": "1"}, "is not a variable name"),
        ("torch", {"OK": "a\x00b"}, "holds a NUL character"),
        ("torch", {"PYTHONUNBUFFERED": "0"}, "['PYTHONUNBUFFERED'], which the runner"),
        ("horovod", {"HOROVOD_GLOO_TIMEOUT_SECONDS": "9"}, "which the horovod backend"),
        ("horovod", {"HOROVOD_CONTROLLER": "mpi"}, "which the horovod backend"),
        ("torch", {"TF_CONFIG": "{}"}, "which the tensorflow backend"),
        ("horovod", {"HOROVOD_FUSION_THRESHOLD": "1"}, "which comm="),
    ],
)
def test_env_names_values_and_what_the_runner_sets_itself_are_refused_on_the_driver(backend, env, says):
    from sparkml_dist.errors import ConfigurationError

    comm = {"bucket_cap_mb": 4} if "HOROVOD_FUSION_THRESHOLD" in env else None
    with pytest.raises(ConfigurationError) as info:
        BarrierRunner(-2, backend=backend, env=env, comm=comm)
    assert says in str(info.value), str(info.value)
    assert BarrierRunner(-2, backend="horovod", env={"HOROVOD_FUSION_THRESHOLD": "1"}).env  # no comm=: yours


def test_a_misspelled_backend_is_named_before_its_comm_settings_are_read():
    from sparkml_dist.errors import ConfigurationError

    with pytest.raises(
        ConfigurationError,
        match=r"backend must be one of \('torch', 'horovod', 'tensorflow', 'jax'\), got 'tourch'",
    ):
        BarrierRunner(-2, backend="tourch", comm={"accumulate": 2})


def test_cli_comm_values_are_read_as_numbers_booleans_or_text():
    from sparkml_dist.cli.run_command import _pairs, _setting

    items = ["bucket_cap_mb=2.5", "accumulate=4", "hierarchical=true", "compression=fp16"]
    got = _pairs("--comm", items, _setting)
    assert got == {"bucket_cap_mb": 2.5, "accumulate": 4, "hierarchical": True, "compression": "fp16"}
    assert _setting("None") is None
    with pytest.raises(Exception, match="--comm 'accumulate': write it as NAME=VALUE"):
        _pairs("--comm", ["accumulate"], _setting)
