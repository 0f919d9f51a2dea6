"""Pure helpers for the rendezvous: rank environments, GPU pinning, slot and encryption checks.
[runs anywhere]

No sockets, no Spark, no torch: everything here is a function of its arguments, so it is tested
directly.
"""

from __future__ import annotations

import re
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..errors import ConfigurationError, InsufficientResourcesError

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


def rank_env(rank: int, hosts: Sequence[str], master_addr: str, master_port: int,
             gpus: Optional[Sequence[str]] = None) -> Dict[str, str]:
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
            "discovery script (spark.executor.resource.gpu.discoveryScript), or set use_gpu=False.")
    return addresses


def _master_slots(master: str, conf: Callable[[str, Optional[str]], Optional[str]]) -> Optional[int]:
    task_cpus = int(conf("spark.task.cpus", "1") or 1)
    m = re.fullmatch(r"local\[(\d+|\*)(?:,\d+)?\]", master)
    if m:
        if m.group(1) == "*":
            import os

            return (os.cpu_count() or 1) // task_cpus
        return int(m.group(1)) // task_cpus
    if master == "local":
        return 1 // task_cpus
    m = re.fullmatch(r"local-cluster\[(\d+),\s*(\d+),\s*(\d+)\]", master)
    if m:
        return int(m.group(1)) * (int(m.group(2)) // task_cpus)
    return None


def check_slots(np_: int, master: str, conf: Callable[[str, Optional[str]], Optional[str]],
                live_slots: Optional[int] = None) -> None:
    """Refuse to launch ``np_`` barrier tasks on a cluster that cannot run them all at once."""
    configured = _master_slots(master, conf)
    slots = live_slots if live_slots is not None else configured
    if configured is not None and live_slots is not None and live_slots < np_ <= configured:
        raise InsufficientResourcesError(
            f"np={np_} barrier tasks need {np_} task slots; {master} will have {configured} but only "
            f"{live_slots} are registered (executors still starting or lost). Retry shortly or lower np.")
    dyn = (conf("spark.dynamicAllocation.enabled", "false") or "false").lower() == "true"
    if dyn:
        cap = conf("spark.dynamicAllocation.maxExecutors", None)
        cores = int(conf("spark.executor.cores", "1") or 1) // int(conf("spark.task.cpus", "1") or 1)
        hint = ("barrier stages need every task running at once, which dynamic allocation cannot "
                "promise; set spark.dynamicAllocation.enabled=false")
        if cap is not None and int(cap) * cores < np_:
            raise InsufficientResourcesError(
                f"np={np_} barrier tasks need {np_} task slots but dynamic allocation allows at most "
                f"{int(cap) * cores} (spark.dynamicAllocation.maxExecutors={cap} x "
                f"spark.executor.cores/spark.task.cpus); {hint}, or lower np.")
        if slots is None or slots < np_:
            raise InsufficientResourcesError(
                f"np={np_} barrier tasks need {np_} task slots but only {slots or 0} are available "
                f"now and spark.dynamicAllocation.enabled=true; {hint}, or lower np.")
        return
    if slots is not None and slots < np_:
        raise InsufficientResourcesError(
            f"np={np_} barrier tasks need {np_} task slots but the cluster has {slots} ({master}, "
            f"spark.task.cpus={conf('spark.task.cpus', '1')}). Lower np or add executors/cores.")


def check_encryption(conf: Callable[[str, Optional[str]], Optional[str]], allow_unencrypted: bool) -> Optional[str]:
    """Refuse an encrypted cluster (gloo/NCCL traffic is not encrypted) unless opted in.

    Returns a warning text when the user opted in, None when the cluster is not encrypted.
    """
    keys = [k for k in ("spark.network.crypto.enabled", "spark.ssl.enabled", "spark.io.encryption.enabled")
            if (conf(k, "false") or "false").lower() == "true"]
    if not keys:
        return None
    text = (f"this cluster is configured for encryption ({', '.join(k + '=true' for k in keys)}), but "
            "torch.distributed traffic between ranks (gloo/NCCL) is not encrypted")
    if not allow_unencrypted:
        raise ConfigurationError(
            f"{text}. Refusing to start; pass allow_unencrypted=True to BarrierRunner to accept "
            "unencrypted collective traffic on this network.")
    return text + "; running anyway because allow_unencrypted=True."
