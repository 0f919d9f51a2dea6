"""The driver at a cluster's scale, in simulation (tests/support/sim_ranks.py): hundreds of ranks
(threads in a few processes) against the real log channel, the runner's console and rank 0's
rendezvous store.  The 1,000 and 4,000-rank figures: benchmarks/bench_scale.py, docs/scale.md."""

import resource

import pytest

from tests.support.sim_ranks import simulate

pytestmark = pytest.mark.slow


def test_200_ranks_rendezvous_and_every_streamed_line_reaches_the_console():
    out = simulate(200, lines_per_s=20, seconds=2, log_ranks="all", procs=2)
    assert out["errors"] == 0, out["first_errors"]
    assert out["reached"] == out["finished"] == 200  # every rank's announcement and end arrived
    assert out["unique_ids"] == {"nccl-unique-id"}  # each read what rank 0 published, after all arrived
    assert out["lines_sent"] == 200 * 40 and out["lost_lines"] == 0
    assert out["rendezvous_s"] < 30 and out["rejected"] == 0


def test_a_driver_with_few_file_descriptors_still_takes_every_rank():
    """Linux's default soft limit is 1,024 descriptors, one per rank connection on the driver: the
    channel raises the driver's soft limit to its hard one instead of failing past it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 1024:
        pytest.skip(f"this machine's hard limit on file descriptors is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (128, hard))  # fewer than the ranks
    try:
        out = simulate(300, lines_per_s=1, seconds=1, log_ranks="0", procs=2)
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == hard
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert out["errors"] == 0, out["first_errors"]
    assert out["reached"] == out["finished"] == 300
