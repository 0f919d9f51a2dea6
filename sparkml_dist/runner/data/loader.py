"""A rank's batches in the global order: bounded memory, read-ahead, decoders, a resumable position.  [rank]

Made by ``shard().dataloader(...)`` (or ``.batches(...)``); see
:mod:`sparkml_dist.runner.data.sample_order` for the order.  Each of the rank's streams is read one
*window* at a time (``window_rows`` rows of whole chunks, converted to numpy once and permuted),
with ``read_ahead`` more windows read by a background thread while the current one is used: what
the rank holds is ``(1 + read_ahead)`` windows per stream plus the batches in flight, whatever the
shard's size.

``transform=fn`` gets each batch as ``{column: values}`` (numeric columns as numpy arrays, (b,)
or (b, d); binary and string columns as object arrays of ``bytes`` / ``str``) and returns what the
loader yields (tensors, a tuple or a dict of them).  ``num_workers=k`` runs ``fn`` in ``k`` forked
processes; only each batch's values travel to them, never the shard.

The position (epoch, next step) is ``state_dict()``; :func:`sparkml_dist.runner.checkpoint.save`
stores the live loaders' positions with the state and :func:`~sparkml_dist.runner.checkpoint.load`
gives them back, so a restarted run continues at the next unseen batch, on any world size with the
same global batch.
"""

from __future__ import annotations

import collections
import itertools
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Dict, Iterator, List, Optional, Sequence

import numpy as np

from ... import arg_checks, feature_arrays
from ...errors import ConfigurationError
from ..timing.clock import CLOCK
from .resize import check_global_batch
from .sample_order import Plan, StreamOrder

_live: "weakref.WeakSet[ShardLoader]" = weakref.WeakSet()
_pending: List[dict] = []  # positions loaded from a checkpoint before their loader existed
_made = itertools.count()  # creation order of the loaders


class _Stream:
    """One stream's windows in one epoch's order: the current one and ``read_ahead`` more."""

    def __init__(self, loader: "ShardLoader", stream: int, epoch: int) -> None:
        self.loader, self.stream = loader, stream
        self.size = loader.sizes[stream]
        groups = getattr(loader.source, "groups", None)
        self.order = StreamOrder(
            loader.source.chunks(stream),
            groups=groups(stream) if groups else None,
            seed=loader.seed,
            epoch=epoch,
            stream=stream,
            shuffle=loader.shuffle,
            window_rows=loader.window_rows,
        )
        self._windows: Dict[int, Future] = {}

    def _load(self, w: int) -> Dict[str, np.ndarray]:
        src, names, dtypes = self.loader.source, self.loader.names, self.loader.dtypes
        import pyarrow as pa

        table = pa.concat_tables([src.read(self.stream, int(i)) for i in self.order.windows[w]])
        perm = self.order.permutation(w)
        return {n: feature_arrays.values(table.column(n), n, dt)[perm] for n, dt in zip(names, dtypes)}

    def _window(self, w: int) -> Dict[str, np.ndarray]:
        pool = self.loader._pool
        for old in [k for k in self._windows if k < w]:
            self._windows.pop(old).cancel()
        for k in range(w, min(w + 1 + self.loader.read_ahead, len(self.order.windows))):
            if k not in self._windows:
                self._windows[k] = pool.submit(self._load, k)
        return self._windows[w].result()

    def take(self, lo: int, hi: int) -> Dict[str, np.ndarray]:
        """The values at positions ``[lo, hi)`` of this stream's epoch order (cycling)."""
        pos = np.arange(lo, hi) % self.size
        wins, offs = self.order.locate(pos)
        cut = np.flatnonzero((np.diff(wins) != 0) | (np.diff(offs) != 1)) + 1
        parts = []
        for a, b in zip(np.concatenate([[0], cut]), np.concatenate([cut, [len(pos)]])):
            arrays = self._window(int(wins[a]))
            parts.append({n: v[offs[a] : offs[a] + (b - a)] for n, v in arrays.items()})
        if len(parts) == 1:
            return parts[0]
        return {n: np.concatenate([p[n] for p in parts]) for n in parts[0]}

    def close(self) -> None:
        for f in self._windows.values():
            f.cancel()
        self._windows.clear()


def _interleave(parts: List[Dict[str, np.ndarray]]) -> Dict[str, np.ndarray]:
    """The streams' values position-major: position 0 of every stream, then position 1, ...
    (a stream with fewer values is left out of the positions it lacks)."""
    if len(parts) == 1:
        return parts[0]
    lengths = [len(next(iter(p.values()))) for p in parts]
    if len(set(lengths)) == 1:
        out = {}
        for n in parts[0]:
            stacked = np.stack([p[n] for p in parts], axis=1)
            out[n] = stacked.reshape(-1, *stacked.shape[2:])
        return out
    starts = np.cumsum([0] + lengths[:-1])
    order = [starts[c] + p for p in range(max(lengths)) for c in range(len(parts)) if p < lengths[c]]
    return {n: np.concatenate([p[n] for p in parts])[order] for n in parts[0]}


def _batch(streams: List["_Stream"], lo: int, hi: int) -> Dict[str, np.ndarray]:
    """A rank's batch of positions ``[lo, hi)``: its streams' rows position-major, then the rows a
    stream shorter than ``hi`` gives again from its start (:meth:`Plan.repeats` counts them)."""
    cut = [min(hi, max(lo, st.size)) for st in streams]
    new = [st.take(lo, c) for st, c in zip(streams, cut) if c > lo]
    again = [st.take(c, hi) for st, c in zip(streams, cut) if hi > c]
    parts = [_interleave(p) for p in (new, again) if p]
    if len(parts) == 1:
        return parts[0]
    return {n: np.concatenate([p[n] for p in parts]) for n in parts[0]}


_worker_fn: Optional[Callable] = None


def _init_worker(fn: Callable) -> None:
    global _worker_fn
    _worker_fn = fn


def _run_worker(values: Dict[str, np.ndarray]):
    return _worker_fn(values)


class ShardLoader:
    """Iterable over one epoch of batches; each ``iter()`` starts the next epoch, or, after
    ``load_state_dict`` (a checkpoint's position), goes on at its next unseen step.
    ``set_epoch(e)`` starts epoch ``e`` explicitly.

    Every row comes once an epoch; the last batch may be shorter, with the same size on every rank.
    ``padding``: how many rows at the end of the batch just yielded repeat rows this epoch already
    gave (only in the last batch of a rank whose shard is a row short; 0 otherwise). Drop them from
    a metric: ``n = len(y) - loader.padding``."""

    def __init__(self, source, sizes: Sequence[int], data_rank: int, data_world: int, names, dtypes, **opt):
        self.source, self.sizes, self.names, self.dtypes = source, list(sizes), list(names), list(dtypes)
        self.rank = data_rank
        global_batch = opt["global_batch_size"] or opt["batch_size"] * data_world
        if global_batch % data_world:
            raise ConfigurationError(
                f"global_batch_size={global_batch} must be a multiple of the {data_world} data ranks"
            )
        check_global_batch(global_batch, data_world)
        self.plan = Plan(self.sizes, global_batch, opt["drop_last"], opt.get("pad_last", False))
        self.batch_size = global_batch // data_world
        self.shuffle, self.seed = bool(opt["shuffle"]), int(opt["seed"])
        self.window_rows, self.read_ahead = int(opt["window_rows"]), int(opt["read_ahead"])
        self.transform, self.num_workers = opt["transform"], int(opt["num_workers"])
        self.device, self.pin_memory = opt["device"], bool(opt["pin_memory"])
        self.epoch, self.step = 0, 0
        self.padding = 0  # rows at the end of the batch just yielded that this epoch gave before
        self._fresh = True  # the next iter() starts at (epoch, step); else at the next epoch
        self._resumed = False  # a restored position not yet iterated from
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="sparkml_dist-read-ahead")
        self._workers = None
        self._made = next(_made)
        _live.add(self)
        if _pending:
            self.load_state_dict(_pending.pop(0))

    def __len__(self) -> int:
        return self.plan.steps

    def redeal(self, source, data_rank: int, data_world: int) -> None:
        """Read ``source`` (data rank ``data_rank`` of ``data_world``'s streams) from the next
        ``iter()`` on, at the same position: the global batch and the sample order stay, each
        rank's batch is ``global_batch / data_world`` rows (a world that changed in place)."""
        if self.plan.global_batch % data_world:
            raise ConfigurationError(
                f"global_batch_size={self.plan.global_batch} cannot be shared by the {data_world} ranks "
                "the world changed to: use a global batch that every world size from min_np to np divides"
            )
        self.source, self.rank = source, data_rank
        self.batch_size = self.plan.global_batch // data_world

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` at the next ``iter()`` (as DistributedSampler's); the epoch a
        checkpoint's position was restored into keeps its step, so the usual
        ``for e in range(start, E): loader.set_epoch(e)`` loop resumes mid-epoch."""
        if self._resumed and int(epoch) == self.epoch:
            return
        self.epoch, self.step, self._fresh = int(epoch), 0, True

    def state_dict(self) -> dict:
        """The position: a few integers (what :mod:`.checkpoint` stores)."""
        return {
            "epoch": self.epoch,
            "step": self.step,
            "global_batch_size": self.plan.global_batch,
            "streams": self.plan.streams,
            "rows": sum(self.sizes),
            "seed": self.seed,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue at ``state``'s position (the same data, seed and streams; a global batch of
        another size resumes at the same sample when the samples seen are a whole number of its
        batches)."""
        mine = self.state_dict()
        for key in ("streams", "rows", "seed"):
            if int(state[key]) != mine[key]:
                raise ConfigurationError(
                    f"the saved loader position is for {key}={state[key]}, this loader has "
                    f"{mine[key]}: resume with the same data, seed and run_with_data(streams=)"
                )
        seen = int(state["step"]) * int(state["global_batch_size"])
        if seen % self.plan.global_batch:
            raise ConfigurationError(
                f"the saved position ({seen} samples into epoch {state['epoch']}) is not a whole "
                f"number of global batches of {self.plan.global_batch}: resume with "
                f"global_batch_size={state['global_batch_size']}"
            )
        self.epoch, self.step = int(state["epoch"]), seen // self.plan.global_batch
        if self.step >= self.plan.steps:
            self.epoch, self.step = self.epoch + 1, 0
        self._fresh = self._resumed = True

    def _raw(self, epoch: int, start: int) -> Iterator[Dict[str, np.ndarray]]:
        streams = [_Stream(self, c, epoch) for c in self.source.streams]
        try:
            for s in range(start, self.plan.steps):
                yield _batch(streams, *self.plan.positions(s))
        finally:
            for st in streams:
                st.close()

    def _decoded(self, raw: Iterator[Dict[str, np.ndarray]]) -> Iterator:
        if self.transform is None:
            import torch

            for values in raw:
                yield tuple(torch.from_numpy(values[n]) for n in self.names)
        elif self.num_workers <= 0:
            for values in raw:
                yield self.transform(values)
        else:
            yield from self._in_workers(raw)

    def _in_workers(self, raw: Iterator[Dict[str, np.ndarray]]) -> Iterator:
        if self._workers is None:
            import torch.multiprocessing as tmp

            ctx = tmp.get_context("fork")
            self._workers = ctx.Pool(self.num_workers, initializer=_init_worker, initargs=(self.transform,))
        flight: collections.deque = collections.deque()
        for values in raw:
            flight.append(self._workers.apply_async(_run_worker, (values,)))
            if len(flight) >= 2 * self.num_workers:
                yield flight.popleft().get()
        while flight:
            yield flight.popleft().get()

    def __iter__(self) -> Iterator:
        if not self._fresh:  # the last epoch was left before its end: iter() starts the next one
            self.epoch, self.step = self.epoch + 1, 0
        self._fresh = self._resumed = False
        epoch, start = self.epoch, self.step
        for s, batch in enumerate(_timed(self._decoded(self._raw(epoch, start))), start):
            self.step = s + 1
            self.padding = self.plan.repeats(s, self.source.streams)
            yield batch if self.device is None else _to_device(batch, self.device, self.pin_memory)
        self.epoch, self.step, self._fresh = epoch + 1, 0, True

    def close(self) -> None:
        """Stop the decoding workers and the read-ahead thread (also done when collected)."""
        if self._workers is not None:
            self._workers.terminate()
            self._workers = None
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def _timed(batches: Iterator) -> Iterator:
    """``batches``, each ask a step's beginning on the rank's clock and the wait for it the step's
    data wait (:mod:`sparkml_dist.runner.timing.clock`); the last batch's step ends when the next
    batch is asked for, which the epoch does not have."""
    it = iter(batches)
    while True:
        CLOCK.begin("loader")
        asked = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            CLOCK.drop("loader")
            return
        CLOCK.waited("data", time.perf_counter() - asked)
        yield batch


def _to_device(batch, device, pin: bool):
    import torch

    if isinstance(batch, torch.Tensor):
        return (batch.pin_memory() if pin else batch).to(device, non_blocking=True)
    if isinstance(batch, (tuple, list)):
        return type(batch)(_to_device(b, device, pin) for b in batch)
    if isinstance(batch, dict):
        return {k: _to_device(v, device, pin) for k, v in batch.items()}
    return batch


def redeal_loaders(old, new, data_rank: int, data_world: int) -> None:
    """Every live loader that read ``old`` (a source) reads ``new`` from its position on, as data
    rank ``data_rank`` of ``data_world`` (see :meth:`ShardLoader.redeal`)."""
    for loader in list(_live):
        if loader.source is old:
            loader.redeal(new, data_rank, data_world)


def check_options(batch_size, global_batch_size, window_rows, read_ahead, num_workers) -> None:
    """A loader's options, refused by name (``Shard.dataloader``)."""
    if (batch_size is None) == (global_batch_size is None):
        raise ConfigurationError("dataloader(): give batch_size (per rank) or global_batch_size, not both")
    arg_checks.integer(
        "batch_size" if batch_size else "global_batch_size", batch_size or global_batch_size, 1
    )
    arg_checks.integer("window_rows", window_rows, 1)
    arg_checks.integer("read_ahead", read_ahead, 0)
    arg_checks.integer("num_workers", num_workers, 0)


def positions() -> List[dict]:
    """Every live loader's position, oldest first (what a checkpoint stores)."""
    return [lo.state_dict() for lo in sorted(_live, key=lambda lo: lo._made)]


def resume(states: List[dict]) -> None:
    """Give loaded positions to the live loaders, oldest first; the rest wait for new loaders."""
    live = sorted(_live, key=lambda lo: lo._made)
    for loader, state in zip(live, states):
        loader.load_state_dict(state)
    _pending[:] = list(states[len(live) :])
