"""What each rank's environment holds beyond the rendezvous: the run's ``env=``.  [driver]

``BarrierRunner(env={...})`` (the drop-ins' options too, ``sparkml-dist run --env NAME=VALUE``) is
checked here once and applied to every rank on every attempt (:class:`~.task_spec.TaskSpec`
carries it, out of its ``repr``): names the runner sets itself are refused by name, values must be
strings or numbers, and a value whose name looks secret (:func:`looks_secret`) is never logged.
An active MLflow run's variables join them (:func:`sparkml_dist.tracking.rank_env`).

Example::

    env = check_env({"NCCL_SOCKET_IFNAME": "eth0"})     # (("NCCL_SOCKET_IFNAME", "eth0"),)
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigurationError

RESERVED_ENV = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "MASTER_ADDR",
    "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK",
    "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE", "HOROVOD_HOSTNAME",
    "HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT", "TF_CONFIG",
)  # fmt: skip
_SECRET_WORDS = ("SECRET", "TOKEN", "PASSWORD", "KEY", "CREDENTIAL", "AUTH")


def looks_secret(name: str) -> bool:
    """A variable whose value is never logged or printed."""
    return any(w in name.upper() for w in _SECRET_WORDS)


def check_env(env: Any) -> tuple:
    """``env=``: a mapping of names to string values for every rank, each attempt; the names the
    runner sets itself (ranks, rendezvous, GPUs, its own ``SPARKML_DIST_*``) refused by name."""
    if env is None:
        return ()
    if not isinstance(env, dict) or not all(isinstance(k, str) and k for k in env):
        raise ConfigurationError(f"env must be a dict of variable names to values, got {type(env).__name__}")
    reserved = sorted(k for k in env if k in RESERVED_ENV or k.startswith("SPARKML_DIST_"))
    if reserved:
        raise ConfigurationError(
            f"env={{...}} sets {reserved}, which the runner sets itself for each rank (its place in "
            "the run, the rendezvous, its GPUs); leave them out"
        )
    bad = [k for k, v in env.items() if not isinstance(v, (str, int, float, bool))]
    if bad:
        raise ConfigurationError(f"env: the values of {bad} must be strings (or numbers)")
    return tuple((k, str(v)) for k, v in env.items())
