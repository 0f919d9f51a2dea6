"""Training functions used by runner tests (module-level so they pickle by reference)."""

import os
import signal
import time


def allreduce_rank_sum(x=0):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    print(f"hello from rank {dist.get_rank()}", flush=True)
    keys = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    return {"sum": t.item(), "x": x, "env": {k: os.environ[k] for k in keys}}


def fail_on(rank_to_fail, how, step=2):
    """Train a few all-reduce steps; rank ``rank_to_fail`` fails at ``step`` in the way ``how``."""
    import torch
    import torch.distributed as dist

    from sparkml_dist.runner import init_process_group

    init_process_group()
    rank = dist.get_rank()
    for i in range(5):
        if rank == rank_to_fail and i == step:
            print(f"rank {rank} about to fail with {how}", flush=True)
            if how == "raise":
                raise ValueError(f"injected failure at step {i}")
            if how == "exit":
                os._exit(7)
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if how == "hang":
                time.sleep(3600)
        t = torch.ones(1)
        dist.all_reduce(t)
    return rank


def sleep_before_init(rank_to_sleep, seconds):
    import torch.distributed as dist

    if int(os.environ["RANK"]) == rank_to_sleep:
        time.sleep(seconds)
    dist.init_process_group("gloo")
    dist.barrier()
    return "done"


def big_result(nbytes):
    return b"x" * nbytes


def shard_summary(batch_size=32, column="x"):
    """Rows, batches per epoch and the column's values, as this rank sees its shard."""
    import torch.distributed as dist

    from sparkml_dist.runner import context, init_process_group, shard

    init_process_group()
    s = shard()
    loader = s.dataloader(batch_size, [column], shuffle=True, seed=1)
    steps = 0
    for (xb,) in loader:
        steps += 1
    values = sorted(s.to_numpy([column]).reshape(-1).tolist())
    dist.barrier()
    return {"rank": context().rank, "rows": s.num_rows, "steps": steps, "values": values}


def kill_my_executor(seconds_before):
    """Rank 1 SIGKILLs the executor JVM running its task (FAULTS #6), then everyone waits."""
    import psutil
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        time.sleep(seconds_before)
        for parent in psutil.Process().parents():
            if "CoarseGrainedExecutorBackend" in " ".join(parent.cmdline()):
                os.kill(parent.pid, signal.SIGKILL)
    time.sleep(600)


def shard_in_order(column="x"):
    """This rank's values of ``column`` in shard order, and its rank (no collectives)."""
    from sparkml_dist.runner import context, shard

    return {"rank": context().rank, "values": shard().table.column(column).to_pylist()}
