"""``elastic.TorchState``: what a rank commits, restores after a loss, and sends a new rank.  [rank]

The state crosses between ranks as one JSON document and one byte buffer, broadcast from a live
rank: the document holds the plain values as JSON holds them (a list of 10^6 floats is one JSON
array), with tags only where JSON would change a value (``{"__sd_t": i}`` a tensor,
``{"__sd_tuple": [...]}`` a tuple, ``{"__sd_dict": [[key, value], ...]}`` a dict whose keys are
not all text, or that holds a key starting ``__sd_``); the tensors travel as their raw bytes, one
buffer of ``uint8`` whatever their dtypes (``uint16``, ``float8``, ``bool``: a collective never sees
a dtype it lacks), each rebuilt from the dtype and shape the document gives.  Nothing a peer sends
is unpickled, so nothing it sends can run code here.

Every rank must hold the same counters (the function makes its ``TorchState`` the same way on
each): :meth:`TorchState.sync` refuses, naming them, counters that only some ranks have.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, List, Tuple

from ...errors import ConfigurationError

_PLAIN = (bool, int, float, str, type(None))
_SCALARS = frozenset(_PLAIN)
_TAG = "__sd_"
_TENSOR, _TUPLE, _DICT = "__sd_t", "__sd_tuple", "__sd_dict"


def _flatten(obj: Any, tensors: list, where: str) -> Any:
    """``obj`` as a JSON value (tensors appended to ``tensors`` and named by index)."""
    import torch

    if torch.is_tensor(obj):
        t = obj.detach()
        tensors.append(t)
        return {_TENSOR: len(tensors) - 1, "shape": list(t.shape), "dtype": str(t.dtype)[len("torch.") :]}
    if isinstance(obj, _PLAIN):
        return obj
    if isinstance(obj, dict):
        keys = list(obj)
        if not all(isinstance(k, (int, str)) and not isinstance(k, bool) for k in keys):
            bad = next(k for k in keys if not isinstance(k, (int, str)) or isinstance(k, bool))
            raise ConfigurationError(f"elastic.TorchState: {where} has a key of type {type(bad).__name__}")
        values = [_flatten(v, tensors, f"{where}[{k!r}]") for k, v in obj.items()]
        if all(isinstance(k, str) and not k.startswith(_TAG) for k in keys):
            return dict(zip(keys, values))
        return {_DICT: [[k, v] for k, v in zip(keys, values)]}
    if isinstance(obj, list):
        if all(type(v) in _SCALARS for v in obj):  # numbers and text (a loss history): as it is
            return obj
        return [_flatten(v, tensors, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return {_TUPLE: [_flatten(v, tensors, f"{where}[{i}]") for i, v in enumerate(obj)]}
    raise ConfigurationError(
        f"elastic.TorchState: {where} is a {type(obj).__name__}; a state holds tensors, numbers, "
        "strings, lists, tuples and dicts of them (keep other objects outside the state)"
    )


def _dtype(name: str):
    import torch

    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"elastic: a peer sent an unknown dtype {name!r}")
    return dtype


def _tensor_specs(node: Any, out: List[Tuple[int, list, str]]) -> List[Tuple[int, list, str]]:
    """Every tensor the document names: (index, shape, dtype), in document order."""
    if isinstance(node, list):
        for v in _nested(node):
            _tensor_specs(v, out)
    elif isinstance(node, dict):
        if _TENSOR in node:
            out.append((int(node[_TENSOR]), [int(s) for s in node["shape"]], str(node["dtype"])))
        elif _TUPLE in node:
            _tensor_specs(node[_TUPLE], out)
        elif _DICT in node:
            for _, v in node[_DICT]:
                _tensor_specs(v, out)
        else:
            for v in node.values():
                _tensor_specs(v, out)
    return out


def _nested(node: list) -> list:
    """The items of a JSON array that hold something (arrays, objects); none for a flat one."""
    if all(type(v) in _SCALARS for v in node):
        return []
    return [v for v in node if isinstance(v, (list, dict))]


def _build(node: Any, tensors: dict) -> Any:
    if isinstance(node, list):
        return [_build(v, tensors) for v in node] if _nested(node) else node
    if not isinstance(node, dict):
        return node
    if _TENSOR in node:
        return tensors[int(node[_TENSOR])]
    if _TUPLE in node:
        return tuple(_build(v, tensors) for v in node[_TUPLE])
    if _DICT in node:
        return {k: _build(v, tensors) for k, v in node[_DICT]}
    return {k: _build(v, tensors) for k, v in node.items()}


def _as_bytes(t):
    """A tensor's elements as a flat ``uint8`` tensor (any dtype: a view where it can be)."""
    import torch

    flat = t.reshape(-1).contiguous()
    return flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8, device=t.device)


def _from_bytes(raw, shape: list, dtype_name: str):
    import torch

    dtype = _dtype(dtype_name)
    count = int(torch.Size(shape).numel())
    if raw.numel() != _nbytes(shape, dtype_name):
        raise ValueError(f"elastic: a peer sent {raw.numel()} bytes for a {dtype_name} tensor of {shape}")
    if not count:
        return torch.empty(shape, dtype=dtype, device=raw.device)
    return raw.clone().view(dtype).reshape(shape)


def _nbytes(shape: list, dtype_name: str) -> int:
    import torch

    return int(torch.Size(shape).numel()) * torch.empty(0, dtype=_dtype(dtype_name)).element_size()


def _broadcast_bytes(data: bytes, root: int, device) -> bytes:
    """``data`` as rank ``root`` has it, on every rank (its length first)."""
    import torch
    import torch.distributed as dist

    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    dist.broadcast(size, root)
    buf = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    if dist.get_rank() == root and len(data):
        buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device))
    dist.broadcast(buf, root)
    return buf.cpu().numpy().tobytes()


def broadcast(obj: Any, root: int, device) -> Any:
    """``obj`` (tensors, numbers, strings, lists, tuples, dicts) as rank ``root`` holds it, on every
    rank: one JSON document, then every tensor's bytes in one buffer (see the module docstring)."""
    import torch
    import torch.distributed as dist

    me, tensors = dist.get_rank(), []
    doc = b""
    if me == root:
        doc = json.dumps(_flatten(obj, tensors, "the state"), separators=(",", ":")).encode()
    tree = json.loads(_broadcast_bytes(doc, root, device).decode())
    specs = sorted(_tensor_specs(tree, []))
    sizes = [_nbytes(shape, dtype) for _, shape, dtype in specs]
    if me == root:
        flat = torch.cat([_as_bytes(tensors[i]).to(device) for i, _, _ in specs]) if specs else None
    else:
        flat = torch.empty(sum(sizes), dtype=torch.uint8, device=device)
    if specs:
        dist.broadcast(flat, root)
    out = {}
    for (index, shape, dtype), piece in zip(specs, torch.split(flat, sizes) if specs else ()):
        out[index] = _from_bytes(piece, shape, dtype)
    return _build(tree, out)


def _same_names(names: List[str], device) -> None:
    """Refuse counters that differ across ranks, naming them and the ranks."""
    import torch
    import torch.distributed as dist

    text = json.dumps(sorted(names))
    digest = int.from_bytes(hashlib.sha256(text.encode()).digest()[:7], "big")
    mine = torch.tensor([digest], dtype=torch.int64, device=device)
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    if len({int(t.item()) for t in every}) == 1:
        return
    held = [json.loads(_broadcast_bytes(text.encode(), r, device).decode()) for r in range(len(every))]
    union = sorted(set().union(*held))
    differ = {n: [r for r, h in enumerate(held) if n in h] for n in union if any(n not in h for h in held)}
    said = "; ".join(f"{n!r} only on ranks {ranks}" for n, ranks in differ.items())
    raise ConfigurationError(
        f"elastic.TorchState: the ranks hold different counters ({said}): make the state the same "
        "way on every rank (the same counter names), so that a new rank's state matches its peers'"
    )


def _keeps_state(value: Any) -> bool:
    """An object the state keeps through its ``state_dict()`` / ``load_state_dict()`` (a
    :class:`~sparkml_dist.runner.data.loader.ShardLoader`'s position, an LR scheduler)."""
    return callable(getattr(value, "state_dict", None)) and callable(getattr(value, "load_state_dict", None))


class TorchState:
    """A model, its optimizer and counters (``epoch=0, batch=0``, any JSON values) that survive a
    lost rank: :meth:`commit` keeps a copy in memory, :meth:`restore` goes back to it, :meth:`sync`
    gives every rank a live rank's copy (``elastic.run`` calls the last two).

    Other objects with ``state_dict()`` and ``load_state_dict()`` are kept the same way:
    ``TorchState(model=m, optimizer=o, loader=shard().dataloader(global_batch_size=64))`` goes
    back to the loader's position of the last commit after a loss (the next ``iter(loader)``
    continues at the next unseen batch), and a new rank gets that position too.

    Counters are attributes: ``state.epoch += 1``. Pass the plain module, not a
    ``DistributedDataParallel``: wrap it inside the ``elastic.run`` function, which runs again in
    every new group.
    """

    def __init__(self, model=None, optimizer=None, **counters) -> None:
        from torch.nn.parallel import DistributedDataParallel

        if isinstance(model, DistributedDataParallel):
            raise ConfigurationError(
                "elastic.TorchState(model=...) got a DistributedDataParallel: pass the plain module "
                "(model.module) and wrap it inside the @elastic.run function, which runs again in "
                "every new process group (a DDP built before a rank was lost holds the old group)"
            )
        handlers = {n: v for n, v in counters.items() if _keeps_state(v)}
        counters = {n: v for n, v in counters.items() if n not in handlers}
        for name, value in counters.items():
            _flatten(value, [], f"counter {name!r}")  # refused now, not at the first loss
        for name, value in handlers.items():
            _flatten(value.state_dict(), [], f"{name}.state_dict()")
        self.__dict__.update(model=model, optimizer=optimizer, commits=0, _names=list(counters))
        self.__dict__.update(counters, _handlers=handlers, **handlers)
        self._saved = self._snapshot()

    def _snapshot(self) -> dict:
        import copy

        return copy.deepcopy(self._payload())

    def _payload(self) -> dict:
        return {
            "model": self.model.state_dict() if self.model is not None else {},
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else {},
            "counters": {n: getattr(self, n) for n in self._names},
            "handlers": {n: h.state_dict() for n, h in self._handlers.items()},
            "commits": self.commits,
        }

    def _load(self, payload: dict) -> None:
        if self.model is not None:
            self.model.load_state_dict(payload["model"])
        if self.optimizer is not None:
            self.optimizer.load_state_dict(payload["optimizer"])
        self.__dict__.update(payload["counters"])
        for name, handler in self._handlers.items():
            handler.load_state_dict(payload["handlers"][name])
        self.commits = int(payload["commits"])

    def commit(self) -> None:
        """Keep this state as the one a loss goes back to (every rank commits at the same steps).
        A rank whose executor is being decommissioned leaves here (``executor_loss="replace"``);
        with ``min_np``, ranks waiting to join are let in here (the function is called again)."""
        from .membership import at_commit

        self.commits += 1
        self._saved = self._snapshot()
        at_commit(self.commits)

    def restore(self) -> None:
        """Go back to the last commit."""
        import copy

        self._load(copy.deepcopy(self._saved))

    def sync(self, fresh: bool = False) -> Tuple[int, int]:
        """Every rank takes the state of the first rank with the most commits (``fresh``: this
        rank has none to offer); returns (that rank, its commits)."""
        import torch
        import torch.distributed as dist

        from .membership import device as rank_device

        device = rank_device()
        _same_names(self._names + [f"{n} (state_dict)" for n in self._handlers], device)
        mine = torch.tensor([-1 if fresh else self.commits], dtype=torch.int64, device=device)
        every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(every, mine)
        counts = [int(t.item()) for t in every]
        root = counts.index(max(counts))
        self._load(broadcast(self._payload(), root, device))
        self._saved = self._snapshot()
        return root, self.commits

    def counters(self) -> dict:
        return {n: getattr(self, n) for n in self._names}
