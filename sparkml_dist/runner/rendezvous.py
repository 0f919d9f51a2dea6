"""Pure helpers for the rendezvous: local ranks, torch.distributed's environment, a task's GPUs.
[runs anywhere]

No sockets, no Spark, no torch: everything here is a function of its arguments, so it is tested
directly.  What differs per backend is in :mod:`sparkml_dist.runner.backends`.
"""

from __future__ import annotations

import os
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from ..errors import InsufficientResourcesError

# torch.distributed's env:// rendezvous then connects every rank, rank 0 included, as a client of
# the store that our rank-0 bootstrap already hosts on an OS-chosen port (no port race).
AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"


def local_ranks(hosts: Sequence[str]) -> List[Tuple[int, int]]:
    """(local_rank, local_world_size) of each rank, from the host each rank runs on."""
    seen: Dict[str, int] = {}
    out = []
    for h in hosts:
        out.append(seen.get(h, 0))
        seen[h] = seen.get(h, 0) + 1
    return [(lr, seen[h]) for lr, h in zip(out, hosts)]


def rank_env(
    rank: int, hosts: Sequence[str], master_addr: str, master_port: int, gpus: Optional[Sequence[str]] = None
) -> Dict[str, str]:
    """The environment an unchanged ``torch.distributed.init_process_group()`` script expects."""
    local_rank, local_world = local_ranks(hosts)[rank]
    env = {
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "RANK": str(rank),
        "WORLD_SIZE": str(len(hosts)),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_world),
        "GROUP_RANK": "0",
        AGENT_STORE_ENV: "True",
    }
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    return env


def task_gpus(resources: Dict[str, object], use_gpu: bool, rank: int) -> Optional[List[str]]:
    """GPU addresses Spark assigned to this task (``BarrierTaskContext.resources()``)."""
    if not use_gpu:
        return None
    gpu = resources.get("gpu") if resources else None
    addresses = list(getattr(gpu, "addresses", []) or []) if gpu is not None else []
    if not addresses:
        raise InsufficientResourcesError(
            f"use_gpu=True but Spark assigned no GPU to the task of rank {rank}. Configure GPU "
            "scheduling: spark.executor.resource.gpu.amount, spark.task.resource.gpu.amount and a "
            "discovery script (spark.executor.resource.gpu.discoveryScript), or set use_gpu=False."
        )
    return addresses


def member_gpu(task_gpus: Sequence[str], member: int, per_task: int, rank: int) -> List[str]:
    """The one GPU of the ``member``-th rank of a task that runs a rank per GPU it holds."""
    if len(task_gpus) < per_task:
        raise InsufficientResourcesError(
            f"the task of rank {rank} runs {per_task} ranks, one per GPU, but Spark assigned it "
            f"{len(task_gpus)} GPU(s) ({', '.join(task_gpus)})"
        )
    return [task_gpus[member]]


def visible_gpus(environ: Optional[Mapping[str, str]] = None) -> List[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` entries.

    ``CUDA_VISIBLE_DEVICES`` when set (read as CUDA does: up to the first ``-1`` or empty entry;
    indices or ``GPU-<uuid>`` names), else every device torch sees (none without a CUDA torch).
    """
    environ = os.environ if environ is None else environ
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        out = []
        for entry in listed.split(","):
            entry = entry.strip()
            if not entry or entry == "-1":
                break
            out.append(entry)
        return out
    try:
        import torch
    except ImportError:
        return []
    return [str(i) for i in range(torch.cuda.device_count())]
