"""Where each rank's time goes (sparkml_dist.runner.timing): a rank slowed on purpose is named while
the run goes on and in the report, its excess where it was put (compute, or data wait); the others
wait for it in all-reduce; every framework's steps are counted."""

import numpy as np

from sparkml_dist.runner import BarrierRunner, last_run
from tests.conftest import masters
from tests.support import timing_helpers as th


def _per_step(report, rank):
    row = report.ranks.set_index("rank").loc[rank]
    return {k: row[k] / row["steps"] for k in ("step_s", "data_s", "compute_s", "comm_s")}


@masters("local")
def test_a_rank_given_more_compute_is_named_slow_and_the_others_wait_for_it(spark):
    """Rank 1 computes 50 ms more a step (DDP over the runner's loader, ~200 steps, 6 summaries):
    named on the console while the run goes on, the report's slowest, its compute ~50 ms a step
    over rank 0's, and rank 0 waiting in all-reduce for it; the steps counted are the loop's."""
    lines = []
    runner = BarrierRunner(2, log_ranks="none", log_sink=lines.append, timeout=240)
    steps = runner.run_with_data(th.rows(spark), th.ddp_with_a_slow_rank, compute_s=0.05)
    report = last_run()
    said = "".join(lines)
    assert "[sparkml_dist] rank 1 on " in said and " is slow: " in said and "compute" in said, said
    assert "the other ranks wait for it in all-reduce" in said
    assert report.slowest == 1 and report.ranks.steps.tolist() == [steps, steps]
    fast, slow = _per_step(report, 0), _per_step(report, 1)
    assert slow["compute_s"] - fast["compute_s"] >= 0.03, (fast, slow)
    assert fast["comm_s"] > slow["comm_s"] + 0.02, (fast, slow)
    assert "rank 1" in report.advice and "sets the pace" in report.advice
    assert report.straggler == 1 and "was the slowest" not in said  # named already: not twice


@masters("local")
def test_a_throttled_loader_shows_in_data_wait_not_compute(spark):
    runner = BarrierRunner(2, log_ranks="none", timeout=240)
    runner.run_with_data(th.rows(spark, n=960), th.ddp_with_a_slow_rank, loader_s=0.03)
    report = last_run()
    fast, slow = _per_step(report, 0), _per_step(report, 1)
    assert slow["data_s"] - fast["data_s"] >= 0.025, (fast, slow)  # 30 ms a batch, in data wait
    assert abs(slow["compute_s"] - fast["compute_s"]) < 0.02, (fast, slow)
    assert "waits" in report.advice and "for its data" in report.advice


@masters("local")
def test_an_undisturbed_run_names_no_rank(spark):
    lines = []
    BarrierRunner(2, log_ranks="none", log_sink=lines.append, timeout=240).run_with_data(
        th.rows(spark, n=960), th.ddp_with_a_slow_rank
    )
    report = last_run()
    assert " is slow: " not in "".join(lines) and "was the slowest" not in "".join(lines)
    assert (report.ranks.steps > 0).all() and np.isfinite(report.ranks.step_s).all()
    assert report.straggler is None
