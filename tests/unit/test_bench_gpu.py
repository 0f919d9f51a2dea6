"""The GPU benchmark's feeding check runs against the current Shard API (here on the CPU), so that
``make gpu-check`` does not first meet a broken benchmark on the GPU machine."""

import os
import sys
import tempfile

import pytest

pytest.importorskip("torch")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))

import bench_gpu  # noqa: E402


def test_the_shard_feed_benchmark_moves_the_same_values_as_numpy_and_leaves_no_file():
    before = set(os.listdir(tempfile.gettempdir()))
    out = bench_gpu.shard_to_gpu(20_000, device="cpu")  # asserts to_torch == from_numpy inside
    assert out["ours_s"] > 0 and out["numpy_to_s"] > 0
    new = set(os.listdir(tempfile.gettempdir())) - before
    assert {n for n in new if not n.startswith("sparkml_dist-pool-")} == set()  # the warm pools' home
