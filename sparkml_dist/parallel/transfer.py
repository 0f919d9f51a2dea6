"""Moving state dicts between ranks without pickle.  [rank]

``torch.distributed``'s object collectives pickle what they send; a rank that unpickles bytes from
the network runs whatever code they name.  Here a tree of dicts, lists, tensors and JSON values
travels as a JSON header (structure, dtypes, shapes) followed by the raw tensors, so reading it
can only build tensors and plain values.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any, List, Sequence

import torch
import torch.distributed as dist

from ..errors import CollectionError

_TENSOR = "__tensor__"


def _flatten(tree: Any, tensors: List[torch.Tensor]) -> Any:
    if isinstance(tree, torch.Tensor):
        tensors.append(tree.detach().contiguous())
        return {_TENSOR: len(tensors) - 1, "dtype": str(tree.dtype).split(".")[-1], "shape": list(tree.shape)}
    if isinstance(tree, dict):
        if any(not isinstance(k, str) for k in tree):
            raise CollectionError(f"cannot send a dict with non-string keys: {list(tree)[:3]}")
        return {"__dict__": {k: _flatten(v, tensors) for k, v in tree.items()}}
    if isinstance(tree, (list, tuple)):
        return [_flatten(v, tensors) for v in tree]
    if tree is None or isinstance(tree, (bool, int, float, str)):
        return tree
    raise CollectionError(
        f"cannot send a {type(tree).__name__} between ranks (tensors and plain values only)"
    )


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise CollectionError(f"received an unknown tensor dtype {name!r}")
    return dtype


def _unflatten(node: Any, tensors: List[torch.Tensor]) -> Any:
    if isinstance(node, dict):
        if _TENSOR in node:
            return tensors[node[_TENSOR]]
        return {k: _unflatten(v, tensors) for k, v in node["__dict__"].items()}
    if isinstance(node, list):
        return [_unflatten(v, tensors) for v in node]
    return node


def _specs(node: Any, out: list) -> list:
    if isinstance(node, dict):
        if _TENSOR in node:
            out.append(node)
        else:
            for v in node["__dict__"].values():
                _specs(v, out)
    elif isinstance(node, list):
        for v in node:
            _specs(v, out)
    return out


def send_tree(tree: Any, dst: int, device: torch.device) -> None:
    """Send ``tree`` to global rank ``dst`` (which calls :func:`recv_tree`)."""
    tensors: List[torch.Tensor] = []
    header = json.dumps(_flatten(tree, tensors)).encode()
    dist.send(torch.tensor([len(header)], dtype=torch.int64, device=device), dst)
    dist.send(torch.frombuffer(bytearray(header), dtype=torch.uint8).to(device), dst)
    for t in tensors:
        dist.send(t.to(device), dst)


def recv_tree(src: int, device: torch.device) -> Any:
    """Receive what global rank ``src`` sent with :func:`send_tree`; tensors come back on the CPU."""
    size = torch.zeros(1, dtype=torch.int64, device=device)
    dist.recv(size, src)
    raw = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    dist.recv(raw, src)
    header = json.loads(raw.cpu().numpy().tobytes().decode())
    specs = _specs(header, [])
    tensors: List[Any] = [None] * len(specs)
    for spec in specs:  # the order send_tree sent them in
        t = torch.empty(spec["shape"], dtype=_dtype(spec["dtype"]), device=device)
        dist.recv(t, src)
        tensors[spec[_TENSOR]] = t.cpu()
    return _unflatten(header, tensors)


def to_cpu(tree: Any) -> Any:
    """``tree`` with every tensor detached and copied to the CPU."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().cpu().clone()
    if isinstance(tree, dict):
        return {k: to_cpu(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [to_cpu(v) for v in tree]
    return tree


def merge_pieces(pieces: List[dict], keys: Sequence[str]) -> dict:
    """The stages' ``{"model": ..., "optimizer": ...}`` pieces as one: the model's entries in the
    unsplit model's key order, the optimizers' states and parameter groups together."""
    model = {k: v for piece in pieces for k, v in piece["model"].items()}
    merged: dict = {"model": OrderedDict((k, model[k]) for k in keys if k in model)}
    if "optimizer" in pieces[0]:
        merged["optimizer"] = {
            "state": {k: v for piece in pieces for k, v in piece["optimizer"]["state"].items()},
            "param_groups": [g for piece in pieces for g in piece["optimizer"]["param_groups"]],
        }
    return merged


def optimizer_part(state: dict, names: set) -> dict:
    """The part of a merged optimizer state (keyed by parameter name) for the parameters ``names``."""
    return {
        "state": {k: v for k, v in state["state"].items() if k in names},
        "param_groups": [
            dict(g, params=[p for p in g["params"] if p in names])
            for g in state["param_groups"]
            if any(p in names for p in g["params"])
        ],
    }
