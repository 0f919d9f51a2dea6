"""One rank of a global forest fit: XGBoost's distributed training in random-forest mode.  [rank]

Runs inside :class:`~sparkml_dist.runner.BarrierRunner` ranks (``run_with_data``): each rank
holds its shard of the rows; rank 0 starts XGBoost's tracker on its own address (``MASTER_ADDR``,
the host the runner's rendezvous chose) and tells the others its port through a torch.distributed
broadcast of one integer (nothing pickled); every rank then joins XGBoost's collective, whose
all-reduce sums the gradient histograms of all shards, so each tree grows from every row.  Rank 0
returns the booster in XGBoost's own UBJSON format (loading it runs no code).

Every wait is bounded by ``timeout`` seconds (the estimator's ``collectiveTimeout``): the tracker's
bootstrap and shutdown, and each worker's connections and collectives.  XGBoost's tracker serves
its connections one at a time, so a connection that never speaks (a port scanner, a health check)
stalls its bootstrap: the workers then fail after ``timeout`` with an error naming the tracker's
address and port.  XGBoost's workers open two listening ports each on every interface (its socket
code binds ``INADDR_ANY``, with no setting to change it); a connection to one of them fails that
worker at once (XGBoost treats it as a peer's error signal).
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional

import numpy as np

from ..errors import WorkerError


def explained(exc: WorkerError) -> WorkerError:
    """[driver] A rank that XGBoost itself stopped (its error port was connected to): say what that means."""
    if "Another worker is running into error" not in (exc.worker_traceback or ""):
        return exc
    message = str(exc).split("\n--- executor traceback ---\n")[0]
    return WorkerError(
        f"{message}: XGBoost stopped that rank's worker because a connection reached its error port. "
        "XGBoost's workers listen on every interface (its socket code binds INADDR_ANY; no setting "
        "changes it), and any connection there, from a failing peer or from a stranger such as a port "
        "scanner, ends the worker. Fit again; keep the executors' ports closed to other machines.",
        rank=exc.rank,
        exit_code=exc.exit_code,
        worker_traceback=exc.worker_traceback,
    )


def _tracker_port(rank: int, world: int, timeout: int):
    """(tracker or None, its port): started on rank 0, the port broadcast to every rank."""
    import torch
    import torch.distributed as dist
    from xgboost.tracker import RabitTracker

    tracker, port = None, torch.zeros(1, dtype=torch.int64)
    if rank == 0:
        tracker = RabitTracker(
            host_ip=os.environ["MASTER_ADDR"], n_workers=world, sortby="task", timeout=timeout
        )
        tracker.start()
        port[0] = int(tracker.worker_args()["dmlc_tracker_port"])
    dist.broadcast(port, src=0)
    return tracker, int(port[0])


def _reason(text: str) -> str:
    """The line of an XGBoost error that says what failed (its first lines are file positions)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and "[bt]" not in ln]
    said = [ln.split("]:", 1)[-1].strip(" -:") for ln in lines]
    return next(
        (s for s in said if any(w in s.lower() for w in ("fail", "timeout", "error"))),
        said[0] if said else "",
    )


def train(
    params: Dict[str, Any],
    classes: Optional[list],
    columns: Dict[str, Any],
    threads: int,
    timeout: int = 600,
) -> Optional[bytes]:
    """Every rank: its shard into a DMatrix, one round of ``num_parallel_tree`` trees grown
    together; rank 0 returns the booster (UBJSON bytes), the others None.  ``columns``:
    ``features`` (column names: numeric columns or one array column), ``label``, ``weight``
    (a name or None)."""
    import torch.distributed as dist
    import xgboost as xgb
    from xgboost import collective

    from ..runner import init_process_group, shard

    init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    data = shard()
    X = data.to_numpy(list(columns["features"]), dtype=np.float32)
    y = data.to_numpy([columns["label"]], dtype=np.float64).ravel()
    w = data.to_numpy([columns["weight"]], dtype=np.float64).ravel() if columns["weight"] else None
    if classes is not None:  # the labels' indices in the classes every rank was given
        y = np.searchsorted(np.asarray(classes, dtype=np.float64), y).astype(np.float64)
    tracker, port = _tracker_port(rank, world, timeout)
    where = f"{os.environ['MASTER_ADDR']}:{port}"
    args = {"dmlc_tracker_uri": os.environ["MASTER_ADDR"], "dmlc_tracker_port": port, "dmlc_timeout": timeout}
    try:
        with collective.CommunicatorContext(**args, dmlc_task_id=str(rank)):
            matrix = xgb.DMatrix(X, y, weight=w, nthread=threads)
            del X
            booster = xgb.train({**params, "nthread": threads}, matrix, num_boost_round=1)
        if tracker is not None:
            tracker.wait_for(timeout)
    except xgb.core.XGBoostError as exc:
        first = _reason(str(exc))
        raise RuntimeError(
            f"XGBoost's collective (tracker {where}) failed or waited past collectiveTimeout="
            f"{timeout}s on rank {rank}: {first[:300]}. A connection to the tracker's port {port} that "
            "never speaks (a port scanner, a health check) or a lost worker stops its bootstrap; "
            "fit again, or raise collectiveTimeout if the ranks are just slow."
        ) from None
    dist.destroy_process_group()
    return bytes(booster.save_raw("ubj")) if rank == 0 else None
