"""``elastic.TorchState``: what a rank commits, restores after a loss, and sends a new rank.  [rank]

The state crosses between ranks as one JSON description (numbers, strings, lists, dicts with their
key types kept) plus the tensors it names, broadcast as one flat buffer per dtype from a live rank:
nothing a peer sends is unpickled, so nothing it sends can run code here.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Tuple

from ...errors import ConfigurationError

_PLAIN = (bool, int, float, str, type(None))


def _flatten(obj: Any, tensors: list, where: str) -> Any:
    import torch

    if torch.is_tensor(obj):
        tensors.append(obj.detach())
        return {"t": len(tensors) - 1, "shape": list(obj.shape), "dtype": str(obj.dtype)[len("torch.") :]}
    if isinstance(obj, dict):
        items = []
        for k, v in obj.items():
            if not isinstance(k, (int, str)):
                raise ConfigurationError(f"elastic.TorchState: {where} has a key of type {type(k).__name__}")
            items.append([k, _flatten(v, tensors, f"{where}[{k!r}]")])
        return {"d": items}
    if isinstance(obj, (list, tuple)):
        return {"l": [_flatten(v, tensors, f"{where}[{i}]") for i, v in enumerate(obj)]}
    if isinstance(obj, _PLAIN):
        return {"v": obj}
    raise ConfigurationError(
        f"elastic.TorchState: {where} is a {type(obj).__name__}; a state holds tensors, numbers, "
        "strings, lists and dicts of them (keep other objects outside the state)"
    )


def _dtype(name: str):
    import torch

    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"elastic: a peer sent an unknown dtype {name!r}")
    return dtype


def _specs(node: Any, out: List[Tuple[int, list, str]]) -> None:
    if "t" in node:
        out.append((int(node["t"]), [int(s) for s in node["shape"]], str(node["dtype"])))
    for v in node.get("l", ()):
        _specs(v, out)
    for _, v in node.get("d", ()):
        _specs(v, out)


def _build(node: Any, tensors: list) -> Any:
    if "t" in node:
        return tensors[int(node["t"])]
    if "d" in node:
        return {k: _build(v, tensors) for k, v in node["d"]}
    if "l" in node:
        return [_build(v, tensors) for v in node["l"]]
    return node["v"]


def broadcast(obj: Any, root: int, device) -> Any:
    """``obj`` (tensors, numbers, strings, lists, dicts) as rank ``root`` holds it, on every rank."""
    import torch
    import torch.distributed as dist

    me, tensors = dist.get_rank(), []
    meta = json.dumps(_flatten(obj, tensors, "the state")).encode() if me == root else b""
    size = torch.tensor([len(meta)], dtype=torch.int64, device=device)
    dist.broadcast(size, root)
    buf = torch.zeros(int(size.item()), dtype=torch.uint8, device=device)
    if me == root:
        buf.copy_(torch.frombuffer(bytearray(meta), dtype=torch.uint8))
    dist.broadcast(buf, root)
    tree = json.loads(bytes(buf.cpu().tolist()).decode())
    specs: List[Tuple[int, list, str]] = []
    _specs(tree, specs)
    by_dtype: Dict[str, List[Tuple[int, list]]] = {}
    for index, shape, dtype in specs:
        by_dtype.setdefault(dtype, []).append((index, shape))
    out: Dict[int, Any] = {}
    for dtype in sorted(by_dtype):  # one flat buffer per dtype, the same order on every rank
        parts = sorted(by_dtype[dtype])
        sizes = [int(torch.Size(shape).numel()) for _, shape in parts]
        if me == root:
            flat = torch.cat([tensors[i].reshape(-1).to(device) for i, _ in parts]) if parts else None
        else:
            flat = torch.empty(sum(sizes), dtype=_dtype(dtype), device=device)
        dist.broadcast(flat, root)
        for (index, shape), piece in zip(parts, torch.split(flat, sizes)):
            out[index] = piece.reshape(shape).clone()
    return _build(tree, [out[i] for i in range(len(out))])


class TorchState:
    """A model, its optimizer and counters (``epoch=0, batch=0``, any JSON values) that survive a
    lost rank: :meth:`commit` keeps a copy in memory, :meth:`restore` goes back to it, :meth:`sync`
    gives every rank a live rank's copy (``elastic.run`` calls the last two).

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
        for name, value in counters.items():
            _flatten(value, [], f"counter {name!r}")  # refused now, not at the first loss
        self.__dict__.update(model=model, optimizer=optimizer, commits=0, _names=list(counters))
        self.__dict__.update(counters)
        self._saved = self._snapshot()

    def _snapshot(self) -> dict:
        import copy

        return copy.deepcopy(self._payload())

    def _payload(self) -> dict:
        return {
            "model": self.model.state_dict() if self.model is not None else {},
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else {},
            "counters": {n: getattr(self, n) for n in self._names},
            "commits": self.commits,
        }

    def _load(self, payload: dict) -> None:
        if self.model is not None:
            self.model.load_state_dict(payload["model"])
        if self.optimizer is not None:
            self.optimizer.load_state_dict(payload["optimizer"])
        self.__dict__.update(payload["counters"])
        self.commits = int(payload["commits"])

    def commit(self) -> None:
        """Keep this state as the one a loss goes back to (every rank commits at the same steps)."""
        self.commits += 1
        self._saved = self._snapshot()

    def restore(self) -> None:
        """Go back to the last commit."""
        import copy

        self._load(copy.deepcopy(self._saved))

    def sync(self, fresh: bool = False) -> Tuple[int, int]:
        """Every rank takes the state of the first rank with the most commits (``fresh``: this
        rank has none to offer); returns (that rank, its commits)."""
        import torch
        import torch.distributed as dist

        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
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
