"""The GPU benchmark's feeding check runs against the current Shard API (here on the CPU), so that
``make gpu-check`` does not first meet a broken benchmark on the GPU machine."""

import os
import sys
import tempfile

import pytest

pytest.importorskip("torch")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))

import bench_gpu  # noqa: E402


def test_the_shard_feed_benchmark_moves_the_same_values_as_numpy_and_leaves_no_file(tmp_path, monkeypatch):
    # A temp directory of its own: the pass's other workers run jobs whose ranks write theirs
    # into the shared one meanwhile (CI failed on their sparkml_dist-<job>-r<rank> folders).
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    out = bench_gpu.shard_to_gpu(20_000, device="cpu")  # asserts to_torch == from_numpy inside
    assert out["ours_s"] > 0 and out["numpy_to_s"] > 0
    assert os.listdir(tmp_path) == []
