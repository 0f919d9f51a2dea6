"""Pure helpers for the rendezvous: nodes, local ranks, torch.distributed's environment.  [anywhere]

No sockets, no Spark, no torch: everything here is a function of its arguments, so it is tested
directly.  What differs per backend is in :mod:`sparkml_dist.runner.backends`.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from ..gpus import gpu_env as gpus_env

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
    the node's number (in order of first rank), and CUDA_VISIBLE_DEVICES
    is :func:`sparkml_dist.gpus.node_gpus`.
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
    env.update(gpus_env(rank, keys, gpus))
    return env
