"""DDP's and Horovod's communication settings in one place: bucket size, accumulation, compression.  [rank]

Runs inside a function given to :class:`~sparkml_dist.runner.BarrierRunner` (or any
``torch.distributed`` job).  :func:`ddp` wraps a model in ``DistributedDataParallel`` with the
settings the Horovod-era vocabulary names:

* the *fusion buffer* is DDP's bucket (``bucket_cap_mb``: gradients all-reduced together, as
  soon as the backward pass has filled a bucket, overlapping communication with the rest of the
  backward pass);
* *gradient accumulation* (``accumulate=k``): :meth:`DataParallel.micro_step` skips the
  all-reduce on k-1 of every k micro-steps (``no_sync``), so k micro-batches cost one all-reduce;
* *reduction servers* (``BarrierRunner(np, comm={"reduction_servers": k})``): the buckets go to
  ``k`` CPU servers that sum them (:mod:`.comm_reduction`) instead of a ring all-reduce;
* *gradient compression* (``compression="fp16"``, ``"bf16"`` or ``"powersgd"`` with
  ``powersgd_rank``): DDP's communication hooks.  fp16 halves the bytes; PowerSGD sends two
  low-rank factors per matrix and keeps the error it made (error feedback) for the next step;
  :meth:`DataParallel.comm_state_dict` holds that state so a checkpoint resumes it.

:func:`horovod` gives Horovod's ``DistributedOptimizer`` the same names (fusion threshold,
accumulation, fp16).  A setting left None takes the run's ``BarrierRunner(comm={...})``
(:mod:`sparkml_dist.runner.comm_settings`).  Defaults are DDP's own: who sets nothing gets plain
DDP.  On fast links compression costs more
than it saves (measured on loopback: docs/parallel.md); it pays only where the link is the
bottleneck.  A setting the process group cannot do is refused naming the backend (bf16 on gloo);
PowerSGD on gloo puts every gradient in one bucket (two in flight deadlock torch's hook there).

Example (2 ranks, 4 micro-batches per optimizer step)::

    from sparkml_dist.parallel import comm
    from sparkml_dist.runner import init_process_group

    def train():
        init_process_group()
        net = comm.ddp(make_net(), accumulate=4, compression="fp16")
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for x, y in batches:
            with net.micro_step() as last:          # the all-reduce runs on the 4th only
                (loss_fn(net(x), y) / 4).backward()
            if last:
                opt.step(); opt.zero_grad()
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ..errors import ConfigurationError
from ..runner import comm_settings
from ..runner.comm_settings import COMPRESSIONS
from . import comm_reduction  # the run's reduction servers: a hook of its own
from .comm_horovod import horovod  # the same settings for Horovod's optimizer

__all__ = ["COMPRESSIONS", "DataParallel", "ddp", "horovod"]


class DataParallel(DistributedDataParallel):
    """``DistributedDataParallel`` with :meth:`micro_step` (gradient accumulation), a count of the
    gradient buckets it all-reduced (``buckets_reduced``) and its compression state for checkpoints."""

    accumulate: int = 1
    buckets_reduced: int = 0
    _micro: int = 0
    _powersgd: Any = None  # PowerSGDState
    _params: List[torch.nn.Parameter] = []  # the module's trained parameters, in order
    _layouts: Dict[int, List[int]] = {}  # bucket index -> its parameters (indices into _params)
    _pending: Optional[Dict[str, Dict[int, torch.Tensor]]] = None  # loaded, not yet in buckets
    _restored: Set[int] = set()

    @contextlib.contextmanager
    def micro_step(self) -> Iterator[bool]:
        """One micro-batch's forward and backward: yields True on the ``accumulate``-th (its
        backward all-reduces the summed gradients: step the optimizer after it), False on the
        others (``no_sync``: gradients only accumulate locally)."""
        self._micro += 1
        last = self._micro % self.accumulate == 0
        if last:
            yield True
        else:
            with self.no_sync():
                yield False

    def comm_state_dict(self) -> Dict[str, Any]:
        """The compression's state (PowerSGD's error feedback and warm-start factors per parameter,
        its step count and random state), as tensors and numbers:
        ``checkpoint.save({"comm": net.comm_state_dict(), ...})``.  Kept per parameter, not per
        bucket: DDP lays its buckets out again after a model's first step, so a resumed model's
        buckets differ from the saved one's until then."""
        out: Dict[str, Any] = {"micro": self._micro}
        s = self._powersgd
        if s is not None:
            error, q = self._per_parameter()
            keys, pos = s.rng.get_state()[1:3]
            out["powersgd"] = {
                "iter": int(s.iter),
                "error": {k: v.clone() for k, v in error.items()},
                "q": {k: v.clone() for k, v in q.items()},
                "rng": torch.from_numpy(keys.astype("int64")),
                "rng_pos": int(pos),
            }
        return out

    def load_comm_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore :meth:`comm_state_dict` (after the model's own state)."""
        self._micro = int(state.get("micro", 0))
        saved, s = state.get("powersgd"), self._powersgd
        if (saved is None) != (s is None):
            raise ConfigurationError(
                "load_comm_state_dict: the checkpoint was saved "
                + ("with" if saved is not None else "without")
                + " compression='powersgd' and this model is wrapped "
                + ("without" if saved is not None else "with")
                + " it: wrap it as the checkpoint was made"
            )
        if s is None:
            return
        import numpy as np

        s.iter = int(saved["iter"])
        s.error_dict, s.p_memory_dict, s.q_memory_dict = {}, {}, {}
        s.rng.set_state(("MT19937", saved["rng"].numpy().astype(np.uint32), int(saved["rng_pos"]), 0, 0.0))
        self._pending = {"error": dict(saved["error"]), "q": dict(saved["q"])}  # laid out per bucket
        self._restored = set()

    # -- PowerSGD's per-bucket buffers <-> per-parameter pieces
    def _shapes(self, layout: List[int]) -> List[Tuple[int, int]]:
        params = self._params
        return [(params[i].shape[0], params[i].numel() // max(params[i].shape[0], 1)) for i in layout]

    def _compressed(self, layout: List[int]) -> List[int]:
        """The parameters of ``layout`` PowerSGD compresses, in the order of its Q buffer."""
        from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress

        s, groups = self._powersgd, {}
        for i, (n, m) in zip(layout, self._shapes(layout)):
            rank = min(n, m, s.matrix_approximation_rank)
            if _should_compress(n, m, rank, s.min_compression_rate)[0]:
                groups.setdefault((n, m), []).append(i)  # batched by shape, first appearance first
        return [i for members in groups.values() for i in members]

    def _sizes(self, layout: List[int], kind: str) -> List[int]:
        if kind == "error":
            return [self._params[i].numel() for i in layout]
        r = self._powersgd.matrix_approximation_rank
        shapes = dict(zip(layout, self._shapes(layout)))
        return [shapes[i][1] * min(shapes[i][0], shapes[i][1], r) for i in self._compressed(layout)]

    def _pieces(self, flat: torch.Tensor, layout: List[int], kind: str) -> List[torch.Tensor]:
        return list(torch.split(flat, self._sizes(layout, kind)))

    def _per_parameter(self) -> Tuple[Dict[int, torch.Tensor], Dict[int, torch.Tensor]]:
        """PowerSGD's error and Q buffers cut into each parameter's piece (pending ones included)."""
        s = self._powersgd
        error: Dict[int, torch.Tensor] = dict(self._pending["error"]) if self._pending else {}
        q: Dict[int, torch.Tensor] = dict(self._pending["q"]) if self._pending else {}
        for b, layout in self._layouts.items():
            if b in s.error_dict and (self._pending is None or b in self._restored):
                error.update(zip(layout, self._pieces(s.error_dict[b], layout, "error")))
            if b in s.q_memory_dict and (self._pending is None or b in self._restored):
                q.update(zip(self._compressed(layout), self._pieces(s.q_memory_dict[b], layout, "q")))
        return error, q

    def _unpack(self) -> None:
        """The buffers as per-parameter pieces, to be laid out again bucket by bucket."""
        error, q = self._per_parameter()
        s = self._powersgd
        s.error_dict, s.p_memory_dict, s.q_memory_dict = {}, {}, {}
        self._pending, self._restored = {"error": error, "q": q}, set()

    def _restore(self, index: int, layout: List[int]) -> None:
        """Before PowerSGD's hook first sees bucket ``index`` after a load: its buffers rebuilt
        from the saved per-parameter pieces, in this bucket's layout."""
        s, pending = self._powersgd, self._pending
        if all(i in pending["error"] for i in layout):
            s.error_dict[index] = torch.cat([pending["error"][i].reshape(-1) for i in layout])
        order = self._compressed(layout)
        if order and all(i in pending["q"] for i in order):
            s.q_memory_dict[index] = torch.cat([pending["q"][i].reshape(-1) for i in order])
            r = s.matrix_approximation_rank
            total_p = sum(n * min(n, m, r) for n, m in self._shapes(order))
            s.p_memory_dict[index] = torch.empty(total_p, dtype=s.q_memory_dict[index].dtype)


def _counted(net: DataParallel, hook):
    """``hook`` counting the buckets it all-reduces and noting each bucket's parameters."""
    where = {p.data_ptr(): i for i, p in enumerate(net._params)}

    def counting(state, bucket):
        net.buckets_reduced += 1
        if net._powersgd is not None:
            layout = [where[p.data_ptr()] for p in bucket.parameters()]
            index = bucket.index()
            before = net._layouts.get(index)
            if before is not None and before != layout:
                net._unpack()  # DDP laid its buckets out again: the buffers follow their parameters
            if net._pending is not None and index not in net._restored:
                net._restore(index, layout)
                net._restored.add(index)
            net._layouts[index] = layout
        return hook(state, bucket)

    return counting


def _check(settings: Dict[str, Any], process_group) -> None:
    """Each setting refused with its name, and what the process group cannot do with its backend."""
    if not dist.is_initialized():
        raise ConfigurationError(
            "comm.ddp: torch.distributed is not initialized: call "
            "sparkml_dist.runner.init_process_group() first"
        )
    comm_settings.check_values("comm.ddp", settings)
    backend = dist.get_backend(process_group)
    if settings["compression"] == "bf16" and backend != "nccl" and not comm_reduction.servers_of_run():
        raise ConfigurationError(
            f"comm.ddp: compression='bf16' needs the nccl backend; this process group is {backend!r} "
            "(gloo cannot all-reduce bfloat16): use compression='fp16' or None"
        )


def _one_bucket(model: torch.nn.Module, bucket_cap_mb: Optional[float]) -> float:
    """PowerSGD's hook waits inside its own futures; on gloo, two buckets in flight deadlock the
    backward pass (measured: a 5.3 M-parameter MLP hung in its third step, with torch's hook alone
    too). One bucket holding every gradient cannot: a given ``bucket_cap_mb`` also sizes DDP's
    first bucket."""
    size_mb = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad) / 2**20
    if bucket_cap_mb is not None and bucket_cap_mb < size_mb:
        raise ConfigurationError(
            f"comm.ddp: compression='powersgd' on gloo needs every gradient in one bucket "
            f"(bucket_cap_mb >= {size_mb:.1f}, this model's MiB of gradients): with bucket_cap_mb="
            f"{bucket_cap_mb} two buckets in flight deadlock the backward pass. Leave bucket_cap_mb unset"
        )
    return max(bucket_cap_mb or 0.0, size_mb + 1.0)


def _servers(compression, process_group) -> int:
    """The run's reduction servers (0: none), refused with what they cannot take."""
    servers = comm_reduction.servers_of_run()
    if servers and (compression == "powersgd" or process_group is not None):
        raise ConfigurationError(
            "comm.ddp: the run has reduction servers (comm={'reduction_servers': ...}), which sum "
            "the buckets of the whole world: "
            + ("compression='powersgd' is not taken with them (they take 'fp16' or 'bf16')"
               if compression == "powersgd" else "a process_group of some ranks is not taken with them")
            + ": leave it out, or the servers"
        )  # fmt: skip
    return servers


def _register_hook(net: DataParallel, compression, powersgd_rank, powersgd_start, process_group) -> None:
    """DDP's communication hook for ``compression`` (or the run's reduction servers), counting the
    buckets it reduces."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if _servers(compression, process_group):
        hook = functools.partial(comm_reduction.hook, wire=comm_reduction.WIRE[compression])
        net.register_comm_hook(comm_reduction.Client.of_run(), _counted(net, hook))
    elif compression == "powersgd":
        net._powersgd = powerSGD_hook.PowerSGDState(
            process_group=process_group,
            matrix_approximation_rank=powersgd_rank,
            start_powerSGD_iter=powersgd_start,
            use_error_feedback=True,
            warm_start=True,
        )
        net.register_comm_hook(net._powersgd, _counted(net, powerSGD_hook.powerSGD_hook))
    else:
        hook = {
            None: default_hooks.allreduce_hook,
            "fp16": default_hooks.fp16_compress_hook,
            "bf16": default_hooks.bf16_compress_hook,
        }[compression]
        net.register_comm_hook(process_group, _counted(net, hook))


def ddp(
    model: torch.nn.Module,
    *,
    bucket_cap_mb: Optional[float] = None,
    accumulate: Optional[int] = None,
    compression: Optional[str] = None,
    powersgd_rank: Optional[int] = None,
    powersgd_start: Optional[int] = None,
    static_graph: Optional[bool] = None,
    process_group=None,
    **ddp_options: Any,
) -> DataParallel:
    """``model`` in :class:`DataParallel` (``DistributedDataParallel``) with these settings.

    A setting left None takes the run's (``BarrierRunner(comm={...})``, see
    :mod:`sparkml_dist.runner.comm_settings`), else the default given below.

    Args:
        bucket_cap_mb: MiB of gradients all-reduced together (DDP's default 25; Horovod's fusion
            threshold).
        accumulate: micro-steps per optimizer step (default 1); :meth:`DataParallel.micro_step`
            all-reduces on the last of each ``accumulate`` only.
        compression: None (DDP's all-reduce of float32), ``"fp16"``, ``"bf16"`` (NCCL only) or
            ``"powersgd"`` (rank-``powersgd_rank`` factors, default 1, with error feedback, after
            ``powersgd_start`` plain steps, default 2).
        static_graph: DDP's ``static_graph`` (default False).
        **ddp_options: any other ``DistributedDataParallel`` argument (``device_ids``, ...).
    """
    settings = comm_settings.resolve(
        {
            "bucket_cap_mb": bucket_cap_mb,
            "accumulate": accumulate,
            "compression": compression,
            "powersgd_rank": powersgd_rank,
            "powersgd_start": powersgd_start,
            "static_graph": static_graph,
        }
    )
    _check(settings, process_group)
    bucket_cap_mb, accumulate, compression = (
        settings[k] for k in ("bucket_cap_mb", "accumulate", "compression")
    )
    powersgd_rank, powersgd_start = settings["powersgd_rank"], settings["powersgd_start"]
    static_graph = settings["static_graph"]
    if compression == "powersgd" and dist.get_backend(process_group) == "gloo":
        bucket_cap_mb = _one_bucket(model, bucket_cap_mb)
    if bucket_cap_mb is not None:
        ddp_options["bucket_cap_mb"] = bucket_cap_mb
    net = DataParallel(model, process_group=process_group, static_graph=static_graph, **ddp_options)
    net.accumulate, net._micro, net.buckets_reduced = accumulate, 0, 0
    net._params = [p for p in net.module.parameters() if p.requires_grad]
    net._layouts, net._pending, net._restored = {}, None, set()
    _register_hook(net, compression, powersgd_rank, powersgd_start, process_group)
    return net
