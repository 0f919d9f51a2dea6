"""Checkpoints inside a training function: rank 0 saves, every rank loads.  [rank]

Give the runner a directory (``BarrierRunner(..., checkpoint_dir="/dbfs/ckpt/run1")``: a local
path or a URI pyarrow opens: ``s3://``, ``gs://``, ``hdfs://``), then inside the function::

    from sparkml_dist.runner import checkpoint

    state = checkpoint.load()                    # the latest state, or None on a fresh start
    start = state["step"] + 1 if state else 0
    if state:
        model.load_state_dict(state["model"]); opt.load_state_dict(state["opt"])
    for step in range(start, steps):
        ...
        if checkpoint.due(step):           # every 100 steps by default
            checkpoint.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, step)

Layout of the directory::

    step-000000000100.pt   torch.save of the state (tensors, dicts, lists, numbers, strings)
    LATEST                 JSON {"step", "file", "bytes", "sha256"}, replaced last

:func:`save` writes the state under a temporary name, moves it into place, then replaces
``LATEST`` the same way, so a crash at any point leaves ``LATEST`` naming a complete file; a step
saved again goes to a new name (``step-000000000100.<digest>.pt``), never over the file ``LATEST``
may name. The directory's rules (a local one is this user's, no link, files 0600, checked at
every open; a failed write's temporary file removed) are :mod:`.files`'s.
:func:`load` checks the size and SHA-256 and reads with ``torch.load(weights_only=True)``: no code
in the file runs, whoever wrote it.  Only rank 0 writes; ``keep`` older files are kept.

Every rank must resume from the same step: a ``checkpoint_dir`` that is a local directory on a
cluster of several hosts holds rank 0's files on rank 0's host only, and the others would silently
start over.  So :func:`load`, called by every rank, compares the steps the ranks found (through the
rendezvous store: plain integers, nothing unpickled) and refuses a mismatch naming the ranks, with
a pointer to shared storage.  Called before the process group exists, it checks once the group is
made by :func:`sparkml_dist.runner.init_process_group`.

**The data position too.**  When ``state`` is a dict and the function reads its shard with
``shard().dataloader(...)``, :func:`save` also stores every live loader's position (epoch, next
step, global batch, streams: a few integers under :data:`LOADERS_KEY`), and :func:`load` hands them
back to the loaders (those made later get theirs when they are made), so the next ``iter(loader)``
continues at the first batch the saved run had not yet trained on: a restart mid-epoch sees every
sample of the epoch exactly once overall, on the same or another world size (same global batch).

**Saving off the training path.**  ``save(state, step, blocking=False)`` blocks rank 0 only while
the state is copied to host memory (tensors cloned storage by storage, so views and tied weights
stay shared and the file is byte for byte what a blocking save writes); a background thread then
serializes, writes and commits it (``LATEST`` last, as above).  Two writes never overlap: the next
``save`` waits for the previous one first.  :func:`wait` waits for the write in flight and raises
its failure; the end of the function waits too (a failed last write is reported as a warning: the
run's result stands).  A write that fails or is killed midway leaves the previous checkpoint the
latest.  The copy costs the state's size in host memory while the write is in flight::

    if checkpoint.due(step):
        checkpoint.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, step,
                        blocking=False)      # back to training after a memory copy
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import sys
from typing import Any, Optional

from ... import arg_checks
from ...errors import CollectionError, ConfigurationError
from ..protocol import CHECKPOINT_DIR_ENV as DIR_ENV
from . import handover
from .background import BackgroundWrite, to_host
from .files import open_dir
from .handover import HandedOver as HandedOver  # the exception a handover ends the function with

LATEST = "LATEST"
_CHECKPOINT_FILE = re.compile(r"step-\d{12}(\.[0-9a-f]{12})?\.pt")  # what save() names; LATEST names no other
LOADERS_KEY = "__sparkml_dist_loaders__"  # where save() keeps the loaders' positions in a dict state
MAX_LATEST_BYTES = 64 << 10  # LATEST is a line of JSON: anything longer is not ours
DEFAULT_EVERY = 100  # steps between checkpoints unless told otherwise (see benchmarks/bench_runner.py)


def due(step: int, every: int = DEFAULT_EVERY) -> bool:
    """True on every ``every``-th step (0-based steps 99, 199, ... by default): when to save; and at
    the step the ranks agreed to hand over at when an executor of the run is decommissioned
    (:mod:`.handover`: then :func:`save` ends the function on every rank with :class:`HandedOver`)."""
    return handover.due(step) or (every > 0 and (step + 1) % every == 0)


def _location(directory: Optional[str] = None):
    """The checkpoint directory, checked and open (:func:`.checkpoint_dir.open_dir`)."""
    where = directory or os.environ.get(DIR_ENV)
    if not where:
        raise ConfigurationError(
            "no checkpoint directory: pass checkpoint_dir=... to BarrierRunner "
            "(a local path, or an s3://, gs://, hdfs:// URI)"
        )
    return open_dir(where)


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _put(folder, name: str, data) -> None:
    """Write ``data`` as ``name`` whole: a temporary name, then a move over the target."""
    folder.put(name, data)


def save(
    state: Any, step: int, *, keep: int = 2, directory: Optional[str] = None, blocking: bool = True
) -> Optional[str]:
    """Rank 0 writes ``state`` as the checkpoint of ``step``; other ranks return None at once.

    Returns the file written (with ``blocking=False``: the file being written; :func:`wait` for
    it).  ``keep`` older checkpoints stay (0: only the latest).  ``blocking=False`` copies the
    state to host memory and writes it in the background (see the module docstring).
    """
    arg_checks.integer("step", step, 0)
    arg_checks.integer("keep", keep, 0)
    if _rank() != 0:
        handover.after_save(step, _rank())
        return None
    wait()  # never two writes at once; a failed background write is raised here
    from ..data import loader

    places = loader.positions()
    if places and isinstance(state, dict):
        state = {**state, LOADERS_KEY: places}
    where = directory or os.environ.get(DIR_ENV) or ""
    with _location(directory) as folder:  # checked now: refused before the state is copied
        path = folder.path(f"step-{step:012d}.pt")
    if blocking:
        written = _write(where, step, state, keep)
        handover.after_save(step, 0)
        return written
    _background.start(step, to_host(state), lambda copy: _write(where, step, copy, keep))
    if handover.due_now(step):  # the handover's checkpoint is written before every rank leaves
        wait()
        handover.after_save(step, 0)
    return path


def _write(where: str, step: int, state: Any, keep: int) -> str:
    """Serialize ``state``, write it under a name no record points at, then ``LATEST``; the path."""
    import torch

    buf = io.BytesIO()
    torch.save(state, buf)
    blob = buf.getbuffer()
    digest = hashlib.sha256(blob).hexdigest()
    with _location(where) as folder:  # opened again: a folder swapped meanwhile is refused
        name = f"step-{step:012d}.pt"
        if name in folder.names():  # the step saved before: LATEST may name that file, keep it whole
            name = f"step-{step:012d}.{digest[:12]}.pt"
        _put(folder, name, blob)
        meta = {"step": step, "file": name, "bytes": len(blob), "sha256": digest}
        _put(folder, LATEST, json.dumps(meta).encode())
        _prune(folder, name, keep)
        return folder.path(name)


_background = BackgroundWrite()  # the one background write of this process (rank 0)


def wait() -> Optional[int]:
    """Wait for the background write in flight (``save(..., blocking=False)``); its step, or None
    when there was none.  Raises :class:`~sparkml_dist.errors.CollectionError` when it failed."""
    return _background.wait()


def finish() -> None:
    """End of the training function (called by the runner): wait for the last background write;
    a failure is reported on stderr, and the run's result stands."""
    try:
        wait()
    except CollectionError as exc:
        print(f"sparkml_dist: warning: {exc}", file=sys.stderr, flush=True)


def _prune(folder, current: str, keep: int) -> None:
    files = sorted(n for n in folder.names() if _CHECKPOINT_FILE.fullmatch(n) and n != current)
    for old in files[: max(0, len(files) - keep)]:
        folder.delete(old)


def latest_step(directory: Optional[str] = None) -> Optional[int]:
    """The step of the latest complete checkpoint, or None."""
    with _location(directory) as folder:
        meta = _latest(folder)
    return None if meta is None else int(meta["step"])


def _latest(folder) -> Optional[dict]:
    body = folder.read(LATEST, MAX_LATEST_BYTES, folder.path(LATEST))
    if body is None:
        return None
    try:
        meta = json.loads(body.decode())
    except ValueError:
        meta = None
    ok = isinstance(meta, dict) and isinstance(meta.get("step"), int) and isinstance(meta.get("bytes"), int)
    if not ok or meta["bytes"] < 0 or not isinstance(meta.get("sha256"), str):
        raise CollectionError(
            f"{folder.path(LATEST)} is not a checkpoint record (JSON with step, file, bytes, sha256)"
        )
    return meta


_pending: list = []  # (step, root) of a load made before the process group existed
_checks = [0]  # loads agreed on so far: names the store keys of the next one


def agree(step: Optional[int], root: str) -> None:
    """Raise on every rank unless every rank found the same latest step (None: no checkpoint)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        _pending[:] = [(step, root)]
        return
    world, rank = dist.get_world_size(), dist.get_rank()
    if world < 2:
        return
    store = dist.distributed_c10d._get_default_store()
    prefix = f"sparkml_dist/checkpoint-step/{_checks[0]}/"
    _checks[0] += 1
    store.set(f"{prefix}{rank}", str(-1 if step is None else step))
    keys = [f"{prefix}{r}" for r in range(world)]
    store.wait(keys)
    steps = [int(store.get(k).decode()) for k in keys]
    store.set(f"{prefix}read/{rank}", "1")
    if rank == 0:  # rank 0's process serves the store: it stays until every rank has read
        store.wait([f"{prefix}read/{r}" for r in range(world)])
    if len(set(steps)) > 1:
        seen = {}
        for r, st in enumerate(steps):
            seen.setdefault(st, []).append(r)
        found = "; ".join(
            f"ranks {rs} {'found no checkpoint' if st < 0 else f'resume from step {st}'}"
            for st, rs in seen.items()
        )
        raise ConfigurationError(
            f"the ranks do not see the same checkpoints in {root}: {found}. On a cluster of several "
            "hosts checkpoint_dir must be storage every host shares (s3://, gs://, hdfs://, or a "
            "mount such as /dbfs/...): a local directory holds only what was written on its own host."
        )


def verify_pending() -> None:
    """The check of a :func:`load` made before the process group existed (called once it does)."""
    if _pending:
        step, root = _pending.pop()
        agree(step, root)


SAFE_TORCH = (2, 6)  # torch.load(weights_only=True) ran code from a crafted file before 2.6 (CVE-2025-32434)


def _check_torch(version: str) -> None:
    """Refuse a torch whose ``weights_only`` loads are not safe, naming the version and the fix."""
    import re

    found = tuple(int(x) for x in re.findall(r"\d+", version)[:2])
    if found < SAFE_TORCH:
        raise ConfigurationError(
            f"torch {version} cannot load checkpoints safely: its torch.load(weights_only=True) runs "
            "code from a crafted file (CVE-2025-32434, fixed in torch 2.6). Upgrade torch to 2.6 or "
            "later on the executors."
        )


def load(directory: Optional[str] = None, map_location: Any = "cpu") -> Optional[Any]:
    """The latest checkpoint's state on every rank, or None when there is none yet.  Every rank
    calls it: the ranks check they found the same step (see the module docstring)."""
    import torch

    from ...formats.files import checked_name

    with _location(directory) as folder:
        root = folder.path("")
        meta = _latest(folder)
        agree(None if meta is None else int(meta["step"]), root)
        if meta is None:
            return None
        name = checked_name(meta.get("file"), _CHECKPOINT_FILE, f"the LATEST record of {root}")
        path = folder.path(name)
        blob = folder.read(name, meta["bytes"], f"checkpoint {path}")
    if blob is None:
        raise CollectionError(f"checkpoint {path}, named by {folder.path(LATEST)}, does not exist")
    if len(blob) != meta["bytes"] or hashlib.sha256(blob).hexdigest() != meta["sha256"]:
        raise CollectionError(
            f"checkpoint {path} does not match its LATEST record (size or SHA-256): "
            "it was changed after it was written"
        )
    _check_torch(torch.__version__)
    state = torch.load(io.BytesIO(blob), map_location=map_location, weights_only=True)
    if isinstance(state, dict) and LOADERS_KEY in state:
        from ..data import loader

        loader.resume(state.pop(LOADERS_KEY))
    return state
