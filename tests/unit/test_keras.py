"""sparkml_dist.keras: Horovod's Keras API on Keras 3's torch backend, run by the runner's ranks
(local processes, np < 0; the Spark modes are in tests/spark/test_frameworks.py)."""

import numpy as np
import pytest

from sparkml_dist import WorkerError
from sparkml_dist.errors import ConfigurationError
from sparkml_dist.horovod import HorovodRunner
from sparkml_dist.runner import BarrierRunner
from tests.support import framework_helpers as fh

pytestmark = pytest.mark.slow


def _close(a, b, tol=1e-5):
    return all(np.allclose(np.array(x), np.array(y), atol=tol, rtol=0) for x, y in zip(a, b))


def test_distributed_optimizer_gives_every_rank_the_weights_of_one_process_on_the_global_batches():
    out = BarrierRunner(-2, timeout=300).run(fh.keras_fit, return_all=True)
    reference = BarrierRunner(-1, timeout=300).run(fh.keras_reference, 2)
    assert out[0]["weights"] == out[1]["weights"]  # bit for bit: every rank applied the same average
    assert _close(out[0]["weights"], reference)  # the averaged gradient is the global batch's
    assert out[0]["backend"] == "torch"  # KERAS_BACKEND set by the runner for its torch ranks
    assert out[0]["optimizer"] == ["SGD", True]  # still an SGD, by name too (saves as a plain one)
    assert out[0]["iterations"] == 2 * fh.ROWS_PER_RANK // fh.BATCH
    assert out[0]["loss"] == out[1]["loss"]  # MetricAverageCallback: the ranks report the mean
    for o in out:
        assert o["size"] == 2 and o["sum"] == 3.0 and o["mean"] == 1.5
        assert o["gathered"] == [0, 0, 1] and o["broadcast"] == [10.0, 7.0]


def test_without_distributed_optimizer_the_ranks_drift_apart():
    out = BarrierRunner(-2, timeout=300).run(fh.keras_fit, distributed=False, return_all=True)
    assert not _close(out[0]["weights"], out[1]["weights"], 1e-4)


def test_broadcast_callback_starts_ranks_with_different_seeds_equal():
    kept = BarrierRunner(-2, timeout=300).run(fh.keras_fit, seed_by_rank=True, return_all=True)
    assert kept[0]["weights"] == kept[1]["weights"]
    apart = BarrierRunner(-2, timeout=300).run(
        fh.keras_fit, seed_by_rank=True, broadcast=False, return_all=True
    )
    assert not _close(apart[0]["weights"], apart[1]["weights"], 1e-4)  # the callback did it


def test_backward_passes_are_accumulated_and_sent_once_per_update():
    out = BarrierRunner(-2, timeout=300).run(fh.keras_fit, passes=2, return_all=True)
    assert out[0]["weights"] == out[1]["weights"]
    assert out[0]["iterations"] == fh.ROWS_PER_RANK // fh.BATCH  # one update every two batches


def test_learning_rate_warmup_ramps_from_lr_over_size_to_lr():
    out = HorovodRunner(np=-2, timeout=300).run(fh.keras_warmup, initial_lr=0.2, warmup_epochs=2)
    steps = fh.ROWS_PER_RANK // fh.BATCH
    expected = [0.2 / 2 * ((s / steps) * (2 - 1) / 2 + 1) for s in range(2 * steps)]
    assert np.allclose(out["lrs"][: 2 * steps], expected, rtol=1e-6)
    assert out["lrs"][0] == pytest.approx(0.1)
    assert out["lrs"][2 * steps :] == [out["lrs"][2 * steps - 1]] * steps  # left alone after warmup
    assert out["momentum"] == pytest.approx(0.9)  # momentum correction is undone after each batch


def test_keras_under_another_backend_is_refused_with_the_fix():
    with pytest.raises(ConfigurationError, match="backend='torch'"):  # on the driver, before any rank
        BarrierRunner(-2, backend="tensorflow").run(fh.keras_fit)
    with pytest.raises(WorkerError) as info:  # Keras imported first on JAX: the rank names it
        BarrierRunner(-1, env={"KERAS_BACKEND": "jax"}, timeout=120).run(fh.keras_imported_first)
    assert "'jax'" in str(info.value) and "KERAS_BACKEND=torch" in str(info.value)


def test_functions_before_init_say_so():
    """In a fresh interpreter: this worker may already hold Keras on another backend (a test before
    it imported Keras 3, whose default is TensorFlow), and sparkml_dist.keras refuses that, rightly."""
    import subprocess
    import sys

    code = (
        "import pytest\n"
        "from sparkml_dist.errors import ConfigurationError\n"
        "import sparkml_dist.keras as hvd\n"
        "hvd.shutdown()\n"
        "with pytest.raises(ConfigurationError, match=r'init\\(\\) first'):\n"
        "    hvd.rank()\n"
        "with pytest.raises(ConfigurationError, match='Adasum'):\n"
        "    hvd.allreduce(1.0, op=hvd.Adasum)\n"
        "print('refused')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("refused"), done.stderr[-3000:]


def test_the_gpu_checks_keras_program_runs_here_on_the_cpu():
    """scripts/gpu_check.py's Keras check, on gloo and the CPU: what the GPU machine will run."""
    from tests.support import gpu_helpers as g

    out = BarrierRunner(-2, timeout=300).run(g.keras_on_gpu, steps=10, return_all=True)
    assert [o["device"] for o in out] == ["cpu", "cpu"] and out[0]["backend"] == "gloo"
    assert out[0]["weights"] == out[1]["weights"] and out[0]["loss"][-1] < out[0]["loss"][0]


def test_load_model_keeps_the_optimizer_state_and_distributes_it(tmp_path):
    out = BarrierRunner(-1, timeout=300).run(fh.keras_load_model, str(tmp_path / "m.keras"))
    assert out == {"class": "Adam", "distributed": True, "state": True, "plain": False}


def test_broadcasts_of_values_that_differ_between_ranks_are_refused_naming_both():
    out = BarrierRunner(-2, timeout=180).run(fh.keras_mismatched_broadcasts, return_all=True)
    for o in out:  # every rank refuses the same way: none is left waiting in a collective
        assert "rank 0 has (2, 3) float32, rank 1 has (3, 2) float32" in o["shape"]
        assert "rank 0 has (3,) float32, rank 1 has (3,) int32" in o["dtype"]
        assert "rank 0 has (3,) float32, rank 1 has (4,) float32" in o["count"]
        assert o["allreduce"].startswith("ConfigurationError: hvd.allreduce")
        # Dense(3) vs Dense(4): the first variable named, with both shapes
        assert "'sequential/dense/kernel': rank 0 has (4, 3) float32, rank 1 has (4, 4)" in o["variables"]
        assert o["alike"] == [0.0, 0.0, 0.0]  # matching values still broadcast
