"""Trial functions for the tuner tests (importable by executors: PYTHONPATH holds the repository root).

``curve``: a known learning curve. The loss at step s is ``(x - 0.3)**2 + 1 / (s + 1)``: the best x is
0.3 whatever the step, and a trial's ranking never changes over its steps, so any early stopping
policy keeps the best trial."""

import os
import time

STEPS = 6


def curve(params, trial):
    x = params["x"]
    loss = None
    for step in range(params.get("steps", STEPS)):
        loss = (x - 0.3) ** 2 + 1.0 / (step + 1)
        trial.report(step, loss=loss, x=x)
        time.sleep(params.get("pause", 0.02))
        if trial.should_stop():
            break
    return None if params.get("return_none") else {"loss": loss}


def timed(params, trial):
    """Returns when it ran (for the concurrency check)."""
    start = time.time()
    time.sleep(params.get("pause", 0.3))
    return {"loss": float(params["x"]), "start": start, "end": time.time(), "pid": float(os.getpid())}


def fails_for_negative(params, trial):
    if params["x"] < 0:
        raise ValueError(f"deliberate failure for x={params['x']}")
    return params["x"] ** 2


def reports_other(params, trial):
    trial.report(0, accuracy=0.5)
    return {"accuracy": 0.5}


def until_stopped(params, trial):
    """Reports forever, until the driver stops it (the tuning's timeout)."""
    step = 0
    while not trial.should_stop():
        trial.report(step, loss=1.0 / (step + 1))
        time.sleep(0.05)
        step += 1
    return None


def where_gpus(params, trial):
    time.sleep(1.0)
    return {"loss": params["x"], "gpus": ",".join(trial.gpus), "device": trial.device}


def _allreduce():
    import torch
    import torch.distributed as dist

    from sparkml_dist.runner import context, init_process_group

    ctx = context()
    init_process_group()
    t = torch.tensor([float(ctx.rank + 1)])
    dist.all_reduce(t)
    return float(t.item())


def nested_runner(params, trial):
    from sparkml_dist.runner import BarrierRunner

    total = BarrierRunner(np=params["np"], start_timeout=60, timeout=120).run(_allreduce)
    return {"loss": -total}


def log_from_ranks():
    """Every rank logs; only rank 0's metrics may reach the driver's MLflow run."""
    from sparkml_dist.runner import context

    ctx = context()
    for step in range(3):
        ctx.log_metrics(step, loss=1.0 / (step + 1) + 100 * ctx.rank, rank=ctx.rank)
    return ctx.rank


def mlflow_from_rank_zero():
    """Rank 0 logs with MLflow's own API, as a user's training code does (no run opened here)."""
    import os

    from sparkml_dist.runner import context

    run_id = os.environ.get("MLFLOW_RUN_ID")  # read first: MLflow takes it out once it used it
    if context().rank == 0:
        import mlflow

        mlflow.log_metric("logged_by_mlflow_in_the_rank", 7.0)
    return run_id


def gang_curve(params, trial):
    """A trial of several ranks: each rank all-gathers what it drew and its world, reports the known
    curve every step (an all-reduce a step, as DDP would: a rank left behind would hang the others)
    and stops when told; rank 0 returns what every rank saw, where each stopped and when each ran."""
    import torch
    import torch.distributed as dist

    from sparkml_dist.runner import init_process_group

    start = time.time()
    init_process_group()
    world = dist.get_world_size()
    mine = torch.tensor([float(params["x"]), float(world), float(trial.rank)])
    seen = [torch.zeros(3) for _ in range(world)]
    dist.all_gather(seen, mine)
    raises = params.get("raise_on_rank") is not None and params["x"] == params.get("raise_at_x", params["x"])
    if raises and trial.rank == params["raise_on_rank"]:
        raise ValueError(f"rank {trial.rank} cannot train x={params['x']}")
    x, last = params["x"], -1
    loss = None
    for step in range(params.get("steps", STEPS)):
        total = torch.ones(1)
        dist.all_reduce(total)  # every rank in every step
        loss = (x - 0.3) ** 2 + 1.0 / (step + 1)
        trial.report(step, loss=loss)
        last = step
        time.sleep(params.get("pause", 0.02))
        if trial.should_stop():
            break
    stops = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(stops, torch.tensor([float(last)]))
    times = [torch.zeros(2) for _ in range(world)]
    dist.all_gather(times, torch.tensor([start, time.time()], dtype=torch.float64).float())
    return {
        "loss": loss,
        "seen": [t.tolist() for t in seen],
        "stopped_at": [int(t.item()) for t in stops],
        "times": [[start, time.time()]],
        "world": world,
    }


def gang_timed(params, trial):
    """A gang trial that says when its ranks ran (start and end of each, wall clock)."""
    import torch
    import torch.distributed as dist

    from sparkml_dist.runner import init_process_group

    init_process_group()
    start = time.time()
    time.sleep(params.get("pause", 2.0))
    dist.barrier()
    spans = [torch.zeros(2, dtype=torch.float64) for _ in range(dist.get_world_size())]
    dist.all_gather(spans, torch.tensor([start, time.time()], dtype=torch.float64))
    return {"loss": float(params["x"]), "spans": [s.tolist() for s in spans]}


def gang_rows(params, trial):
    """A gang trial on the tuning's data: the rows each rank holds, by id."""
    from sparkml_dist.runner import shard

    ids = shard().to_numpy(["id"]).ravel()
    return {"loss": float(params["x"]), "rows": int(len(ids)), "id_sum": int(ids.sum())}


def kills_its_driver(params, trial):
    """Trial 2 kills the driver that runs the tuning (SIGKILL) while it runs."""
    import signal

    if trial.number == params["kill_at"]:
        time.sleep(0.5)
        os.kill(int(params["driver"]), signal.SIGKILL)
        time.sleep(60)
    return {"loss": (params["x"] - 0.3) ** 2}
