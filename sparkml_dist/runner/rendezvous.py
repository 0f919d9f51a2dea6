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


def horovod_slots(hosts: Sequence[str]) -> List[Dict[str, object]]:
    """Each rank's Horovod placement (the fields of ``horovod.runner.common.util.hosts.SlotInfo``).

    local rank: order among the ranks on its host; cross rank: order of its host among the hosts
    that have a rank of that local rank (hosts in order of their first rank), as ``horovodrun``
    assigns them.
    """
    locals_ = local_ranks(hosts)
    first_seen = list(dict.fromkeys(hosts))
    slots = []
    for rank, (host, (local_rank, local_size)) in enumerate(zip(hosts, locals_)):
        peers = [h for h in first_seen if sum(1 for x in hosts if x == h) > local_rank]
        slots.append({"hostname": host, "rank": rank, "local_rank": local_rank,
                      "cross_rank": peers.index(host), "size": len(hosts), "local_size": local_size,
                      "cross_size": len(peers)})
    return slots


def horovod_env(rank: int, hosts: Sequence[str], server_addr: str, server_port: int,
                iface: Optional[str], timeout_s: float) -> Dict[str, str]:
    """The environment ``hvd.init()`` reads to join a Gloo job whose rendezvous server is given.

    ``iface``: the network interface this rank's Gloo device binds (the one holding the address
    it advertised); None leaves Gloo to resolve the host name. RANK/WORLD_SIZE/LOCAL_RANK are set
    too, for :func:`sparkml_dist.runner.shard` and code that reads them.
    """
    slot = horovod_slots(hosts)[rank]
    env = {
        "HOROVOD_HOSTNAME": str(slot["hostname"]),
        "HOROVOD_RANK": str(rank), "HOROVOD_SIZE": str(slot["size"]),
        "HOROVOD_LOCAL_RANK": str(slot["local_rank"]), "HOROVOD_LOCAL_SIZE": str(slot["local_size"]),
        "HOROVOD_CROSS_RANK": str(slot["cross_rank"]), "HOROVOD_CROSS_SIZE": str(slot["cross_size"]),
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": server_addr, "HOROVOD_GLOO_RENDEZVOUS_PORT": str(server_port),
        "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_TIMEOUT_SECONDS": str(max(1, int(round(timeout_s)))),
        "RANK": str(rank), "WORLD_SIZE": str(slot["size"]),
        "LOCAL_RANK": str(slot["local_rank"]), "LOCAL_WORLD_SIZE": str(slot["local_size"]),
    }
    if iface:
        env["HOROVOD_GLOO_IFACE"] = iface
    return env


def host_gpus(rank: int, hosts: Sequence[str], gpus: Sequence[Optional[Sequence[str]]]) -> Optional[List[str]]:
    """CUDA_VISIBLE_DEVICES for a Horovod rank: its host's task GPUs in local-rank order.

    Horovod code pins a GPU with ``torch.cuda.set_device(hvd.local_rank())``: device index
    ``local_rank`` is then the GPU Spark assigned to this rank's task, and NCCL sees its peers.
    When a task holds other than one GPU, the rank sees only its own (index 0).
    """
    mine = gpus[rank]
    if mine is None:
        return None
    same_host = [gpus[r] for r, h in enumerate(hosts) if h == hosts[rank]]
    if all(g is not None and len(g) == 1 for g in same_host):
        return [g[0] for g in same_host]  # type: ignore[index]
    return list(mine)


def schedules_gpus(conf: Callable[[str, Optional[str]], Optional[str]]) -> bool:
    """Whether the cluster gives GPUs to executors (or, in local mode, to the driver)."""
    return any(conf(k, None) for k in ("spark.executor.resource.gpu.amount", "spark.driver.resource.gpu.amount"))


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


def master_slots(master: str, conf: Callable[[str, Optional[str]], Optional[str]]) -> Optional[int]:
    """Task slots a local or local-cluster master has by construction (None for other masters)."""
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
    configured = master_slots(master, conf)
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
