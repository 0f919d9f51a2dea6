"""One (candidate, fold) unit after another: the executor side of ParallelSearchCV.  [executor]

Each task runs the units of its partitions with scikit-learn's own ``_fit_and_score``; the search's
data and settings are unpickled once per Python worker (:func:`sparkml_dist.serialization.cached_loads`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Iterable, Iterator, List, Optional

import pyarrow as pa
from sklearn.base import clone
from sklearn.model_selection._validation import _fit_and_score

from .. import collection, progress, serialization
from .. import gpus as gpus_mod


@dataclass(frozen=True)
class SearchSpec:
    key: str  # SHA-256 of payload: the worker-side cache key
    payload: bytes  # pickled Job
    n_units: int
    n_parts: int
    progress: Optional[tuple] = None  # (host, port, secret): tell the driver's bar of each fit
    gpus: Optional[tuple] = None  # use_gpu: () the task's GPU, else the driver's to deal (gpus.plan_models)


@dataclass
class Job:
    estimator: Any
    X: Any
    y: Any
    candidates: List[dict]
    splits: List[tuple]
    kwargs: Dict[str, Any]


def search_task(batches: Iterable[pa.RecordBatch], spec: SearchSpec) -> Iterator[pa.RecordBatch]:
    """Run the units of the partitions in ``batches`` (unit u belongs to partition u mod n_parts)."""
    parts = [p for b in batches for p in b.column(0).to_pylist()]
    if not parts:
        return
    job = serialization.cached_loads(spec.payload, spec.key)  # once per Python worker
    n_splits, n_cand = len(job.splits), len(job.candidates)
    with progress.Reporter(spec.progress) as report:
        yield from _units(parts, job, spec, n_splits, n_cand, report)


def _units(parts, job, spec, n_splits, n_cand, report) -> Iterator[pa.RecordBatch]:
    for part in parts:
        for unit in range(part, spec.n_units, spec.n_parts):
            cand, split = divmod(unit, n_splits)
            train, test = job.splits[split]
            estimator = clone(job.estimator)
            if spec.gpus is not None:
                gpus_mod.place_model(estimator, spec.gpus, unit)
            result = _fit_and_score(
                estimator,
                job.X,
                job.y,
                train=train,
                test=test,
                parameters=job.candidates[cand],
                split_progress=(split, n_splits),
                candidate_progress=(cand, n_cand),
                **job.kwargs,
            )
            report()
            yield collection.encode(unit, 0, result)
