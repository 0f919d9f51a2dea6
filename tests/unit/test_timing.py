"""Each rank's step clock on every framework, and the driver's report (local processes, np < 0;
the straggler on Spark tasks over the runner's loader: tests/spark/test_timing.py)."""

import pytest

from sparkml_dist.runner import BarrierRunner, last_run
from sparkml_dist.runner.timing import clock as clock_mod
from sparkml_dist.runner.timing.report import Board
from tests.support import timing_helpers as th

pytestmark = pytest.mark.slow  # starts rank processes: not in make test-fast


def test_the_clock_counts_the_most_explicit_steps_once():
    clock = clock_mod.StepClock()
    clock.begin("hook")
    clock.begin("hook")  # a framework's step: counted
    clock.begin("step")  # the function's own marks take over from here
    clock.end("step")
    clock.begin("hook")  # ignored now
    clock.begin("step")
    clock.waited("data", 0.001)
    clock.end("step")
    totals = clock.totals()
    assert totals["steps"] == 3 and totals["data_s"] == 0.001


def test_a_step_abandoned_for_a_lost_peer_counts_neither_it_nor_the_wait_after_it():
    """Inside elastic.run, the step in flight when a peer was lost and the wait for the group to
    form again are nobody's step time: the survivor is not named the straggler for them."""
    import time

    clock = clock_mod.StepClock()
    clock.begin("hook")
    clock.begin("hook")  # one step done
    time.sleep(0.05)
    clock.abandon()  # the peer was lost mid-step
    time.sleep(0.05)  # the group forms again
    clock.begin("hook")
    clock.begin("hook")  # one more step
    totals = clock.totals()
    assert totals["steps"] == 2 and totals["step_s"] < 0.05, totals


def test_a_malformed_summary_is_dropped_and_a_slow_rank_is_named_once():
    said = []
    board = Board(2, said.append, {0: "h0", 1: "h1"})
    board.add(1, {"steps": -1, "step_s": 1, "data_s": 0, "comm_s": 0})
    board.add(1, {"steps": "many"})
    assert board.ranks == {}
    for i in range(1, 6):
        board.add(0, {"steps": 10 * i, "step_s": 1.0 * i, "data_s": 0.0, "comm_s": 0.4 * i})
        board.add(1, {"steps": 10 * i, "step_s": 2.0 * i, "data_s": 0.0, "comm_s": 0.0})
    assert len(said) == 1 and "rank 1 on h1 is slow" in said[0] and "compute" in said[0], said
    report = board.report()
    assert report.slowest == 1 and report.ranks.steps.tolist() == [50, 50]
    assert report.straggler == 1 and "rank 1 on h1 was the slowest" in report.line


@pytest.mark.parametrize(
    "fn, backend",
    [
        (th.ddp_own_tensors, "torch"),
        (th.marked_steps, "torch"),
        (th.horovod_steps, "horovod"),
        (th.keras_torch_steps, "torch"),
        (th.keras_tf_fit_steps, "tensorflow"),
    ],
    ids=["ddp", "step()", "horovod", "sparkml_dist.keras", "keras-fit-tensorflow"],
)
def test_every_framework_gets_a_report_with_its_steps(fn, backend):
    lines = []
    steps = BarrierRunner(-2, backend=backend, log_ranks="none", log_sink=lines.append, timeout=300).run(fn)
    report = last_run()
    assert report.ranks.steps.tolist() == [steps, steps], report.ranks
    assert (report.ranks.step_s > 0).all() and report.seen


def test_a_function_with_no_step_still_gets_a_report():
    lines = []
    BarrierRunner(-2, log_ranks="none", log_sink=lines.append, timeout=120).run(th.no_steps)
    report = last_run()
    assert report.ranks.steps.tolist() == [0, 0] and report.slowest is None and not report.seen
    assert "slow" not in "".join(lines)  # nothing said of steps no one saw
    assert "no steps were seen" in report.advice
