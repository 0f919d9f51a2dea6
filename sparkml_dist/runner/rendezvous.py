"""Pure helpers for the rendezvous: local ranks, torch.distributed's environment, a task's GPUs.
[runs anywhere]

No sockets, no Spark, no torch: everything here is a function of its arguments, so it is tested
directly.  What differs per backend is in :mod:`sparkml_dist.runner.backends`.
"""

from __future__ import annotations

import os
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from ..errors import InsufficientResourcesError
from .protocol import DEVICE_ENV, DEVICES_ENV

# torch.distributed's env:// rendezvous then connects every rank, rank 0 included, as a client of
# the store that our rank-0 bootstrap already hosts on an OS-chosen port (no port race).
AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"


NODE_RULES = ("host", "task")


def node_keys(hosts: Sequence[str], nodes: str = "host", ranks_per_task: int = 1) -> List[str]:
    """What makes a "node" for each rank: its host (torchrun's rule: the ranks of a machine are
    one node) or its Spark task (pyspark TorchDistributor's rule: each task is a node)."""
    if nodes == "task":
        return [f"task {r // ranks_per_task}" for r in range(len(hosts))]
    return list(hosts)


def local_ranks(hosts: Sequence[str]) -> List[Tuple[int, int]]:
    """(local_rank, local_world_size) of each rank, from the node (host) each rank runs on."""
    seen: Dict[str, int] = {}
    out = []
    for h in hosts:
        out.append(seen.get(h, 0))
        seen[h] = seen.get(h, 0) + 1
    return [(lr, seen[h]) for lr, h in zip(out, hosts)]


def rank_env(
    rank: int,
    keys: Sequence[str],
    master_addr: str,
    master_port: int,
    gpus: Optional[Sequence[Optional[Sequence[str]]]] = None,
) -> Dict[str, str]:
    """The environment an unchanged torchrun-style script expects (``init_process_group()``,
    ``torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))``, Lightning, Accelerate).

    ``keys``: each rank's node (:func:`node_keys`); ``gpus``: each rank's GPUs (None without).
    LOCAL_RANK / LOCAL_WORLD_SIZE count the ranks of this rank's node, GROUP_RANK = NODE_RANK is
    the node's number (in order of first rank), and CUDA_VISIBLE_DEVICES is :func:`node_gpus`.
    """
    local_rank, local_world = local_ranks(keys)[rank]
    nodes = list(dict.fromkeys(keys))
    group = nodes.index(keys[rank])
    env = {
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "RANK": str(rank),
        "WORLD_SIZE": str(len(keys)),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_world),
        "GROUP_RANK": str(group),
        "NODE_RANK": str(group),
        "GROUP_WORLD_SIZE": str(len(nodes)),
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(len(keys)),
        "ROLE_NAME": "default",
        AGENT_STORE_ENV: "True",
    }
    env.update(gpu_env(rank, keys, gpus))
    return env


def node_gpus(rank: int, keys: Sequence[str], gpus: Sequence[Optional[Sequence[str]]]) -> Optional[List[str]]:
    """CUDA_VISIBLE_DEVICES for ``rank``: its node's GPUs in local-rank order (torchrun's rule:
    ``LOCAL_RANK`` then indexes the rank's own GPU, and NCCL sees its peers on the node), when every
    rank of the node holds exactly one GPU and no two share one; otherwise (several GPUs per rank,
    GPUs shared through fractional amounts) the rank sees only its own, from index 0."""
    mine = gpus[rank] if gpus else None
    if mine is None:
        return None
    same = [gpus[r] for r, k in enumerate(keys) if k == keys[rank]]
    if all(g is not None and len(g) == 1 for g in same):
        flat = [g[0] for g in same]  # type: ignore[index]
        if len(set(flat)) == len(flat):
            return flat
    return list(mine)


def gpu_env(
    rank: int, keys: Sequence[str], gpus: Optional[Sequence[Optional[Sequence[str]]]]
) -> Dict[str, str]:
    """CUDA_VISIBLE_DEVICES and the index of the rank's (first) GPU in it (``context().device``)."""
    visible = node_gpus(rank, keys, gpus) if gpus else None
    if visible is None:
        return {}
    own = ",".join(str(visible.index(g)) for g in gpus[rank])
    return {"CUDA_VISIBLE_DEVICES": ",".join(visible), DEVICE_ENV: own.split(",")[0], DEVICES_ENV: own}


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


def member_gpu(
    task_gpus: Sequence[str], member: int, per_task: int, rank: int, per_rank: int = 1
) -> List[str]:
    """The GPUs of the ``member``-th rank of a task that runs a rank per ``per_rank`` GPUs it holds."""
    if len(task_gpus) < per_task * per_rank:
        raise InsufficientResourcesError(
            f"the task of rank {rank} runs {per_task} ranks of {per_rank} GPU(s) each, but Spark "
            f"assigned it {len(task_gpus)} GPU(s) ({', '.join(task_gpus)})"
        )
    return list(task_gpus[member * per_rank : (member + 1) * per_rank])


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
