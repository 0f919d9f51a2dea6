"""The training function of the ``elastic.run`` tests: ranks killed mid-run, rows counted by id."""

import os
import signal

from sparkml_dist.runner import elastic

STEPS, ROWS, WIDTH = 12, 8, 4
_NOTICED = []  # the step this rank's executor was decommissioned at


def _rows(step: int, rank: int, world: int):
    """Rank ``rank``'s rows of global batch ``step``: (ids, x, y)."""
    import torch

    g = torch.Generator().manual_seed(step * world + rank)
    x = torch.randn(ROWS, WIDTH, generator=g)
    ids = [step * world * ROWS + rank * ROWS + i for i in range(ROWS)]
    return ids, x, x.sum(1, keepdim=True) + 0.5


def _model():
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(WIDTH, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def global_ids(step: int, world: int):
    return [_rows(step, r, world)[0] for r in range(world)]


def one_process(world: int, steps: int = STEPS, features=None, seen=None):
    """What one process computes on the same global batches (every rank's rows of a step): those
    of :func:`_rows`, or those ``seen`` names by id in ``features`` ({id: 4 floats})."""
    import torch

    model, opt = _model()
    for step in range(steps):
        if seen is None:
            x = torch.cat([_rows(step, r, world)[1] for r in range(world)])
        else:
            x = torch.tensor([features[i] for ids in seen[step][1] for i in ids], dtype=torch.float32)
        loss = ((model(x) - x.sum(1, keepdim=True) - 0.5) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def main(marks: str, kills=(), from_shard: bool = False, settle: float = 0.0):
    """``kills``: (rank, step) pairs; each kills that rank once (SIGKILL) when it reaches the step,
    ``settle`` seconds after reaching it; (rank, step, "executor") kills its executor's JVM instead
    (the executor's Python side, its warm pool and the rank die with it); (rank, step,
    "decommission") sends that JVM SIGPWR (Spark decommissions it) and the rank trains on, its
    steps 0.5 s long from then on (the driver's watch asks twice a second). Every step a rank
    completes is appended to ``done-<rank>`` (a step redone shows twice). ``state.seen``: each
    committed step's global batch, by id, each rank's rows in rank order (a replicated counter). A
    process whose function starts with what an optimizer imports already imported (a spare rank)
    leaves an ``ahead-`` mark."""
    import sys

    import torch.distributed as dist

    dist.init_process_group("gloo")
    open(os.path.join(marks, f"start-{dist.get_rank()}-{os.getpid()}"), "w").close()
    if "torch._dynamo" in sys.modules:
        open(os.path.join(marks, f"ahead-{dist.get_rank()}-{os.getpid()}"), "w").close()
    model, opt = _model()
    state = elastic.TorchState(model=model, optimizer=opt, step=0, seen=[])
    train(state, marks, {tuple(k[:2]): (k[2:] or ("process",))[0] for k in kills}, from_shard, settle)
    ranks = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, {"pid": os.getpid(), "seen": state.seen})
    return {"weights": {k: v.detach().clone() for k, v in state.model.state_dict().items()}, "ranks": ranks}


def _shard_rows(step: int):
    import torch

    from sparkml_dist.runner import shard

    table = shard().to_numpy(["id", "x0", "x1", "x2", "x3"], dtype="float64")
    table = table[table[:, 0].argsort()]
    pick = [(step * ROWS + i) % len(table) for i in range(ROWS)]
    x = torch.tensor(table[pick, 1:], dtype=torch.float32)
    return [int(i) for i in table[pick, 0]], x, x.sum(1, keepdim=True) + 0.5


@elastic.run
def train(state, marks, kills, from_shard, settle=0.0):
    import time

    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    ddp = torch.nn.parallel.DistributedDataParallel(state.model)  # built again in every group
    while state.step < STEPS:
        mark = os.path.join(marks, f"killed-{rank}-{state.step}")
        if (rank, state.step) in kills and not os.path.exists(mark):
            open(mark, "w").close()
            time.sleep(settle)
            from tests.support.helpers import kill_my_executor_jvm

            if kills[(rank, state.step)] == "decommission":
                kill_my_executor_jvm(signal.SIGPWR)
                _NOTICED.append(state.step)
            elif kills[(rank, state.step)] == "executor":
                kill_my_executor_jvm()
                time.sleep(60)  # ended with its task (its pool or keeper kills it): never trains on
            if not _NOTICED:
                os.kill(os.getpid(), signal.SIGKILL)
        if _NOTICED:
            time.sleep(0.5)
        ids, x, y = _shard_rows(state.step) if from_shard else _rows(state.step, rank, world)
        loss = ((ddp(x) - y) ** 2).mean()
        state.optimizer.zero_grad()
        loss.backward()
        state.optimizer.step()
        every = [torch.zeros(ROWS, dtype=torch.int64) for _ in range(world)]
        dist.all_gather(every, torch.tensor(ids, dtype=torch.int64))  # the step's global batch, by id
        state.seen = state.seen + [[state.step, [[int(i) for i in t] for t in every]]]
        with open(os.path.join(marks, f"done-{rank}"), "a") as fh:
            fh.write(f"{state.step}\n")
        state.step += 1
        state.commit()


def resizing_loader(marks: str, kill_step: int, least: int = STEPS, step_s: float = 0.25, most: int = 400):
    """``executor_loss="replace"`` with ``min_np=1``: rank 1's executor JVM is SIGKILLed when it
    reaches step ``kill_step`` (-1: never, a reference run); rank 0 goes on alone once
    ``resize_wait`` passed, and the steps go on (``step_s`` each) past ``least`` until the world is
    whole again (at most ``most``).  The rows come from the runner's loader
    (``global_batch_size=8``) kept in the state: a world that changes deals the streams again and
    goes on at the next unseen batch.  ``state.sizes``: each committed step's world size;
    ``state.seen``: its global batch by id; ``done-<pid>``: the steps each process completed."""
    import torch.distributed as dist

    from sparkml_dist.runner import shard

    dist.init_process_group("gloo")
    open(os.path.join(marks, f"start-{dist.get_rank()}-{os.getpid()}"), "w").close()
    model, opt = _model()
    loader = shard().dataloader(global_batch_size=ROWS, columns=["id", "x0", "x1", "x2", "x3"], seed=1)
    state = elastic.TorchState(model=model, optimizer=opt, loader=loader, step=0, seen=[], sizes=[])
    _train_from_loader(state, marks, kill_step, least, step_s, most)
    ranks = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, {"pid": os.getpid(), "seen": state.seen, "sizes": state.sizes})
    weights = {k: v.detach().clone() for k, v in state.model.state_dict().items()}
    return {"weights": weights, "ranks": ranks}


@elastic.run
def _train_from_loader(state, marks, kill_step, least, step_s, most):
    import time

    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    ddp = torch.nn.parallel.DistributedDataParallel(state.model)
    going = lambda: (state.step < least or 1 in state.sizes[-1:]) and state.step < most  # noqa: E731
    while going():
        for ids, *columns in state.loader:  # from the position of the last commit
            if rank == 1 and state.step == kill_step and not os.path.exists(os.path.join(marks, "killed")):
                open(os.path.join(marks, "killed"), "w").close()
                from tests.support.helpers import kill_my_executor_jvm

                kill_my_executor_jvm()
                time.sleep(60)
            time.sleep(step_s)
            x = torch.stack(columns, 1).float()
            loss = ((ddp(x) - x.sum(1, keepdim=True) - 0.5) ** 2).mean()
            state.optimizer.zero_grad()
            loss.backward()
            state.optimizer.step()
            every = [torch.zeros(len(ids), dtype=torch.int64) for _ in range(world)]
            dist.all_gather(every, ids.to(torch.int64))
            state.seen = state.seen + [[state.step, [[int(i) for i in t] for t in every]]]
            state.sizes = state.sizes + [world]
            with open(os.path.join(marks, f"done-{os.getpid()}"), "a") as fh:
                fh.write(f"{state.step}\n")
            state.step += 1
            state.commit()
            if not going():
                break


def state_crossing(n_floats: int = 10**6):
    """Rank 0's state broadcast to rank 1 (which holds other values) the way ``elastic.run`` sends
    it to a new rank: dtypes gloo lacks, a large list counter, tuples; what rank 1 got, and the
    seconds and resident memory the crossing cost there."""
    import resource
    import time

    import torch
    import torch.distributed as dist

    from sparkml_dist.runner.elastic import state as state_mod

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    base = 1 if rank == 0 else 0
    state = {
        "u16": (torch.arange(5) * base + 7).to(torch.uint16),
        "f8": (torch.ones(3) * (base + 1)).to(torch.float8_e4m3fn),
        "flag": torch.tensor(bool(base)),
        "empty": torch.zeros(0, 3),
        "losses": [0.5 * base] * n_floats,
        "pair": (base, "x"),
        "nested": {3: (1.5, [base]), "__sd_t": "a text key that looks like a tag"},
    }
    dist.barrier()  # both ranks' states made: the time below is the crossing's
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    got = state_mod.broadcast(state, 0, "cpu")
    took = time.perf_counter() - start
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss) / 1024
    return {
        "u16": got["u16"].tolist(),
        "u16_dtype": str(got["u16"].dtype),
        "f8": got["f8"].float().tolist(),
        "f8_dtype": str(got["f8"].dtype),
        "flag": bool(got["flag"]),
        "empty": list(got["empty"].shape),
        "losses": (len(got["losses"]), got["losses"][0], got["losses"][-1]),
        "pair": got["pair"],
        "nested": got["nested"],
        "seconds": took,
        "grown_mib": grown,
    }


def uneven_counters():
    """Rank 1 makes its state with a counter rank 0 lacks: ``elastic.run`` refuses, naming it."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    extra = {"only_here": 1} if dist.get_rank() == 1 else {}
    state = elastic.TorchState(model=torch.nn.Linear(2, 1), step=0, **extra)

    @elastic.run
    def train(state):
        return state.step

    return train(state)


def raises_inside(marks: str, failing: int = 1, at: int = 3):
    """Rank ``failing`` raises a ValueError at step ``at`` inside ``elastic.run`` (a bug, not a
    lost rank); each process leaves a ``ran-<rank>-<pid>`` mark as it starts."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    open(os.path.join(marks, f"ran-{dist.get_rank()}-{os.getpid()}"), "w").close()
    model, opt = _model()
    state = elastic.TorchState(model=model, optimizer=opt, step=0)

    @elastic.run
    def steps(state):
        while state.step < STEPS:
            if dist.get_rank() == failing and state.step == at:
                raise ValueError(f"injected bug at step {state.step}")
            t = torch.ones(1)
            dist.all_reduce(t)
            state.step += 1
            state.commit()

    steps(state)
    return state.step


def lost_after_the_last_step(marks: str, linger: float = 8.0):
    """:func:`train`'s steps with no loss on the way; then, still inside ``elastic.run``, rank 1's
    first process dies (SIGKILL, 2 s after the last step: its spare exists) while rank 0 takes
    ``linger`` seconds more before returning. Rank 0's weights and steps."""
    import time

    import torch.distributed as dist

    open(os.path.join(marks, f"start-{os.environ['RANK']}-{os.getpid()}"), "w").close()
    dist.init_process_group("gloo")  # the new rank 1 never returns from it: the training is over
    model, opt = _model()
    state = elastic.TorchState(model=model, optimizer=opt, step=0, seen=[])

    @elastic.run
    def steps_then_loss(state):
        train.__wrapped__(state, marks, {}, False)  # the steps, inside this elastic.run
        mark = os.path.join(marks, "lost-after-the-end")
        if dist.get_rank() == 1 and not os.path.exists(mark):
            open(mark, "w").close()
            time.sleep(2.0)
            os.kill(os.getpid(), signal.SIGKILL)
        if dist.get_rank() == 0:
            time.sleep(linger)
        return state.step

    steps = steps_then_loss(state)
    return {"weights": {k: v.detach().clone() for k, v in state.model.state_dict().items()}, "steps": steps}


def my_pool_started(before: float, wait_s: float = 0.0) -> dict:
    """A rank's pool (its parent: the pool that forked it): whether it is one, and whether it was
    started before ``before`` (a time.time()); the rank then waits ``wait_s`` seconds."""
    import time

    import psutil

    from sparkml_dist.runner.tasks.warm_pool import POOL_MARK

    parent = psutil.Process().parent()
    time.sleep(wait_s)
    return {"pool": POOL_MARK in " ".join(parent.cmdline()), "earlier": parent.create_time() < before}
