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

import re
from typing import Any, Dict, Optional

from ..errors import ConfigurationError

RESERVED_ENV = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "NODE_RANK",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE",
    "CUDA_VISIBLE_DEVICES", "PYTHONUNBUFFERED",
)  # fmt: skip
_SECRET_WORDS = ("SECRET", "TOKEN", "PASSWORD", "KEY", "CREDENTIAL", "AUTH")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # POSIX: what execve can carry as a name


def looks_secret(name: str) -> bool:
    """A variable whose value is never logged or printed."""
    return any(w in name.upper() for w in _SECRET_WORDS)


def check_env(env: Any, reserved: Optional[Dict[str, str]] = None) -> tuple:
    """``env=``: a mapping of names to string values for every rank, each attempt. A name must be
    a POSIX name (letters, digits, ``_``; no ``=``, no NUL) and a value hold no NUL; the names the
    runner sets itself (ranks, rendezvous, GPUs, its own ``SPARKML_DIST_*``) and those in
    ``reserved`` (name -> who sets it: a backend, ``comm=``) are refused by name, never silently
    replaced."""
    if env is None:
        return ()
    if not isinstance(env, dict):
        raise ConfigurationError(f"env must be a dict of variable names to values, got {type(env).__name__}")
    names = [k for k in env if not (isinstance(k, str) and _NAME.fullmatch(k))]
    if names:
        raise ConfigurationError(
            f"env: {names[0]!r} is not a variable name: a name is letters, digits and '_', not starting "
            "with a digit (no '=', spaces or NUL), e.g. {'NCCL_SOCKET_IFNAME': 'eth0'}"
        )
    owners = {**(reserved or {}), **{k: "the runner" for k in RESERVED_ENV}}
    taken = sorted(k for k in env if k in owners or k.startswith("SPARKML_DIST_"))
    if taken:
        who = sorted({owners.get(k, "the runner") for k in taken})
        raise ConfigurationError(
            f"env={{...}} sets {taken}, which {' and '.join(who)} set(s) itself for each rank (its "
            "place in the run, the rendezvous, its GPUs, the comm= settings): leave them out "
            "(a comm= setting is changed in comm={...})"
        )
    bad = [k for k, v in env.items() if not isinstance(v, (str, int, float, bool))]
    if bad:
        raise ConfigurationError(f"env: the values of {bad} must be strings (or numbers)")
    nul = [k for k, v in env.items() if "\x00" in str(v)]
    if nul:
        raise ConfigurationError(
            f"env: the value of {nul[0]!r} holds a NUL character, which no environment can"
        )
    return tuple((k, str(v)) for k, v in env.items())
