"""Faults between hosts, each bounded in time with an error that names the host: a host killed
(every process of its namespace), a host cut off (its link down) mid all-reduce, the driver's
ports blocked by a firewall rule, the driver unreachable from one worker.  Runs in the
several-hosts pass (``make test-hosts``); the tests share one cluster and run in file order (a
killed host's worker is started again before the next test needs it)."""

import os
import threading
import time

import pytest

from sparkml_dist import InsufficientResourcesError, WorkerError
from sparkml_dist.runner import BarrierRunner
from tests.support import host_helpers as hh
from tests.support.runner_checks import assert_no_rank_left


class Background:
    """A run on a thread; ``lines`` is what the driver streamed; ``wait_for(text)`` blocks until
    a streamed line holds ``text``."""

    def __init__(self, runner_kw: dict, fn, **kw) -> None:
        self.lines, self.out, self.error, self.ended_at = [], None, None, None
        self.runner = BarrierRunner(log_sink=self.lines.append, **runner_kw)
        self.thread = threading.Thread(target=self._go, args=(fn, kw), daemon=True)
        self.thread.start()

    def _go(self, fn, kw) -> None:
        try:
            self.out = self.runner.run(fn, **kw)
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            self.error = exc
        self.ended_at = time.monotonic()

    def wait_for(self, text: str, timeout: float = 180.0) -> None:
        end = time.monotonic() + timeout
        while not any(text in ln for ln in list(self.lines)):
            assert self.thread.is_alive(), f"the run ended before '{text}': {self.error}"
            assert time.monotonic() < end, f"no '{text}' within {timeout}s: {self.lines[-5:]}"
            time.sleep(0.1)

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"the run did not end within {timeout}s"


@pytest.fixture(autouse=True)
def every_host_up(spark, hosts):
    """Each test starts with both workers up (a test that killed one may have failed early)."""
    if not hosts["host2"].pids():
        hosts.start_worker("host2")
    _until_slots(spark, 4)


def test_blocked_log_port_training_completes_output_kept_and_driver_says_why_once(spark, hosts, tmp_path):
    logs = tmp_path / "logs"
    hosts.block_ports()
    try:
        kw = {"np": 4, "timeout": 240, "log_ranks": "all", "log_dir": str(logs), "work_dir": str(tmp_path)}
        run = Background(
            {**kw, "checkpoint_dir": str(tmp_path / "ck")}, hh.train_steps, steps=150, pause=0.15
        )
        run.wait_for("live logs are off", timeout=90)  # said while the ranks train, not after
        run.join(180)
    finally:
        hosts.unblock_ports()
    assert run.error is None and run.out["world"] == 4, run.error
    said = [ln for ln in run.lines if "live logs are off" in ln]
    assert len(said) == 1 and f"{hosts.driver.address}:" in said[0] and "log_dir=" in said[0], run.lines
    assert not any("] step " in ln for ln in run.lines)  # nothing streamed: the port is blocked
    files = sorted(os.listdir(logs))
    assert [f.split("-")[0] for f in files] == ["rank0", "rank1", "rank2", "rank3"], files
    assert "step 149 world 4" in (logs / files[0]).read_text()  # rank 0's output, kept whole


def test_driver_unreachable_from_one_worker_is_refused_before_any_rank_starts(spark, hosts, tmp_path):
    hosts.block_ports(source="host2")
    t = time.monotonic()
    try:
        with pytest.raises(WorkerError) as err:
            BarrierRunner(4, timeout=240, work_dir=str(tmp_path / "work")).run(
                hh.mark_started, str(tmp_path / "m")
            )
    finally:
        hosts.unblock_ports()
    took = time.monotonic() - t
    text = str(err.value)
    assert f"driver's address {hosts.driver.address}" in text and hosts["host2"].address in text, text
    assert "spark.driver.host" in text and "SPARK_LOCAL_IP" in text
    assert not (tmp_path / "m").exists() or os.listdir(tmp_path / "m") == []  # no rank ran the function
    assert took < 60, took
    assert_no_rank_left(within=30)


def test_host_cut_off_mid_allreduce_fails_within_collective_timeout_naming_it(spark, hosts, tmp_path):
    run = Background(
        {
            "np": 4,
            "timeout": 300,
            "collective_timeout": 15,
            "checkpoint_dir": str(tmp_path),
            "work_dir": str(tmp_path),
        },
        hh.train_steps,
        steps=400,
        pause=0.1,
    )
    run.wait_for("step 5 ")
    hosts.cut("host2")
    cut_at = time.monotonic()
    try:
        run.join(90)
    finally:
        hosts.restore("host2")
    took = run.ended_at - cut_at
    print(f"host cut off -> {type(run.error).__name__} in {took:.1f}s: {str(run.error)[:300]}")
    assert isinstance(run.error, WorkerError), run.error
    text = str(run.error)
    assert hosts["host2"].address in text or "host2" in text, text
    assert took < 15 + 20, took
    assert_no_rank_left(within=60)  # the cut-off ranks end by themselves once their collective times out


def _last_step(run) -> int:
    return max(int(ln.split("step ")[1].split()[0]) for ln in list(run.lines) if "] step " in ln)


def _until_slots(spark, n: int, timeout: float = 120.0) -> None:
    from sparkml_dist import _spark_env

    end = time.monotonic() + timeout
    while _spark_env.registered_slots(spark) != n:
        assert time.monotonic() < end, f"the cluster did not get back to {n} slots within {timeout}s"
        time.sleep(0.5)


def test_killed_host_without_restarts_fails_fast_naming_it(spark, hosts, tmp_path):
    kw = {
        "np": 4,
        "timeout": 300,
        "collective_timeout": 30,
        "checkpoint_dir": str(tmp_path),
        "work_dir": str(tmp_path),
    }
    run = Background(kw, hh.train_steps, steps=400, pause=0.1)
    run.wait_for("step 5 ")
    hosts.kill_host("host2")
    killed_at = time.monotonic()
    run.join(90)
    took = run.ended_at - killed_at
    assert isinstance(run.error, WorkerError), run.error
    assert "no word from ranks" in str(run.error) and hosts["host2"].address in str(run.error)
    assert took < 30 + 10, took
    print(f"host killed -> {type(run.error).__name__} in {took:.1f}s: {str(run.error)[:300]}")
    assert_no_rank_left(within=30)


def _resume_alone(src, step: int, dst) -> None:
    """A checkpoint directory holding only ``src``'s checkpoint of ``step``."""
    import hashlib
    import json
    import shutil

    dst.mkdir()
    name = f"step-{step:012d}.pt"
    shutil.copy(src / name, dst / name)
    blob = (dst / name).read_bytes()
    meta = {"step": step, "file": name, "bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
    (dst / "LATEST").write_text(json.dumps(meta))


def test_elastic_restart_goes_on_with_the_ranks_left_and_equals_a_resumed_two_rank_run(
    spark, hosts, tmp_path
):
    import torch

    ck = tmp_path / "ck"
    kw = {
        "np": 4,
        "min_np": 2,
        "max_restarts": 2,
        "timeout": 400,
        "collective_timeout": 30,
        "work_dir": str(tmp_path),
    }
    run = Background(
        {**kw, "checkpoint_dir": str(ck)}, hh.train_steps, steps=30, pause=0.3, every=5, keep=100
    )
    run.wait_for("step 12 ")
    hosts.kill_host("host2")
    k = _last_step(run)
    run.join(240)
    assert run.error is None, run.error
    out = run.out
    assert out["world"] == 2 and out["resumed_from"] >= k - 5, (out, k)
    assert any("restarting with 2" in ln for ln in run.lines), run.lines[-10:]
    ref_dir = tmp_path / "ref"
    _resume_alone(ck, out["resumed_from"], ref_dir)
    ref = BarrierRunner(2, timeout=240, checkpoint_dir=str(ref_dir), clean_work_dir=True).run(
        hh.train_steps, steps=30, pause=0.0
    )
    assert ref["resumed_from"] == out["resumed_from"] and ref["world"] == 2
    assert torch.allclose(out["weight"], ref["weight"], atol=1e-6) and torch.allclose(
        out["bias"], ref["bias"]
    )
    # without min_np the old rule holds: np=4 waits for 4 slots, and fails when they do not come
    t = time.monotonic()
    with pytest.raises(InsufficientResourcesError, match="np=4"):
        BarrierRunner(4, start_timeout=8, timeout=120, clean_work_dir=True).run(
            hh.mark_started, str(tmp_path)
        )
    assert time.monotonic() - t < 8 + 20
    assert_no_rank_left(within=30)


def test_a_host_lost_with_min_np_goes_on_in_place_and_grows_back_when_it_returns(spark, hosts, tmp_path):
    """``executor_loss="replace"``, ``np=4``, ``min_np=2``: host2 (two ranks) is killed at step 5.
    The two ranks on host1 keep their processes: after ``resize_wait`` they go on as a world of 2
    (the console names host2 as where the lost ranks ran); once host2's worker is started again,
    Spark runs the two lost tasks there, their new ranks join at a commit and the world is 4 again.
    Every step's global batch is the same 64 rows whatever the world, so the weights are one
    process's on them.  ~90 s: host2's worker, executor and ranks start again while host1 trains."""
    import re

    import torch

    marks = tmp_path / "marks"
    marks.mkdir()
    kw = {
        "np": 4,
        "min_np": 2,
        "max_restarts": 4,
        "executor_loss": "replace",
        "resize_wait": 5,
        "timeout": 400,
        "collective_timeout": 60,
        "work_dir": str(tmp_path),
    }
    run = Background(kw, hh.train_in_place, marks=str(marks), least=30, pause=0.2)
    run.wait_for("step 5 ")
    hosts.kill_host("host2")
    run.wait_for("2 of 4 ranks (min_np=2)", timeout=120)
    alone = _last_step(run)
    hosts.start_worker("host2")
    run.join(300)
    assert run.error is None, run.error
    text = "".join(run.lines)
    print(text[-3000:])
    sizes = run.out["sizes"]
    assert sizes[:5] == [4] * 5 and 2 in sizes and sizes[-1] == 4, sizes
    lost = re.findall(r"rank (\d) \(on ([\d.]+)\) lost with its executor", text)
    assert len(lost) == 2 and {h for _, h in lost} == {hosts["host2"].address}, lost  # host2 named
    rejoined = re.findall(r"rank (\d) rejoined at commit (\d+)", text)
    assert sorted(r for r, _ in rejoined) == sorted(r for r, _ in lost), rejoined
    assert len({c for _, c in rejoined}) == 1 and int(rejoined[0][1]) > alone, (rejoined, alone)
    starts = [n.split("-")[1:] for n in os.listdir(marks)]
    kept = {int(pid) for rank, pid in starts if sum(r == rank for r, _ in starts) == 1}
    assert len(kept) == 2 and kept <= set(run.out["pids"]), (starts, run.out["pids"])  # host1's ranks
    weight, bias = hh.one_process(len(sizes))
    assert torch.allclose(run.out["weight"], weight, atol=1e-5) and torch.allclose(
        run.out["bias"], bias, atol=1e-5
    )
    assert_no_rank_left(within=30)


def test_a_run_short_of_slots_asks_a_growing_cluster_and_starts_once_it_grew(spark, hosts, tmp_path):
    """An "autoscaler" that starts host2's worker only once the driver has tasks waiting (as
    Databricks' does): the run asks for its slots, the worker comes, the run starts."""
    from tests.support.hosts import Autoscaler

    hosts.kill_host("host2")
    _until_slots(spark, 2)
    lines = []
    with Autoscaler(hosts, spark, "host2") as scaler:
        out = BarrierRunner(
            4, start_timeout=150, timeout=300, log_sink=lines.append, clean_work_dir=True
        ).run(hh.where_am_i, return_all=True)
    assert scaler.grew_at is not None
    assert sorted({r["host"] for r in out}) == ["host1", "host2"]
    assert any("waiting up to" in ln and "task slots (2 now)" in ln for ln in lines), lines
    assert_no_rank_left(within=30)
