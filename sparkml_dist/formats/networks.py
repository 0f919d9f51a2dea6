"""A trained network as safetensors + JSON, rebuilt by a builder the caller names.  [anywhere]

A directory (a local path or a URI pyarrow opens) holding::

    weights.safetensors   the state dict's tensors (safetensors: raw bytes and a bounded header)
    model.json            {"builder": "pkg.models:make_net", "builder_kwargs": {...}, "sha256": ...,
                           "aliases": {...}, "signature": ...}

Loading runs no code from the files: the weights are read by safetensors; the JSON only says which
builder made the module and with which plain arguments, and :func:`load` calls a builder *the
caller* gives (``builder=make_net``) or allow-lists (``allowed=[make_net]`` or
``allowed=["pkg.models:make_net"]``): a name that appears only in the file is never imported.  With
a signing key (``key=`` or ``SPARKML_DIST_MODEL_KEY``, as for model stores) ``model.json`` carries
an HMAC, checked before anything is built.

Networks split or sharded while training are saved from their full state dict: a
``parallel.pipeline`` (its ``full_state_dict()``, gathered on rank 0) and FSDP2 modules (DTensor
parameters, gathered with ``torch.distributed.checkpoint``); every rank calls :func:`save` (the
gathering is a collective), rank 0 writes.  A DDP wrapper is unwrapped.

Example::

    from sparkml_dist import torch_models

    torch_models.save("/dbfs/models/net", net, builder=make_net, builder_kwargs={"hidden": 64})
    net = torch_models.load("/dbfs/models/net", builder=make_net)
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import posixpath
import re
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Union

from ..errors import CollectionError, ConfigurationError
from . import signing
from .checks import UnsafeModelError

WEIGHTS = "weights.safetensors"
META = "model.json"
FORMAT = "sparkml_dist.torch_model/1"
MAX_META_BYTES = 1 << 20
_NAME = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")

Builder = Union[Callable[..., Any], str]


def builder_name(builder: Builder) -> str:
    """``"module:qualname"`` of a builder (a class or a module-level function)."""
    if isinstance(builder, str):
        if not _NAME.fullmatch(builder):
            raise ConfigurationError(f"builder={builder!r} must be 'package.module:name'")
        return builder
    module, qual = getattr(builder, "__module__", None), getattr(builder, "__qualname__", "")
    if not callable(builder) or not module or "<" in qual:
        raise ConfigurationError(
            f"builder={builder!r} must be a class or a function defined at a module's top level "
            "(not a lambda or a nested function): load() rebuilds the network by calling it"
        )
    return f"{module}:{qual}"


def _resolve(name: str) -> Callable[..., Any]:
    module, _, qual = name.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


def full_state(module) -> Optional[Dict[str, Any]]:
    """The whole network's state dict as CPU tensors (None on ranks that do not write)."""
    import torch

    if isinstance(module, Mapping):
        return dict(module)
    if hasattr(module, "full_state_dict") and not isinstance(module, torch.nn.Module):
        return module.full_state_dict()  # parallel.pipeline: gathered on rank 0
    inner = (
        getattr(module, "module", module) if type(module).__name__ == "DistributedDataParallel" else module
    )
    state = inner.state_dict()
    if any(hasattr(t, "full_tensor") for t in state.values()):  # FSDP2: DTensor shards
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(inner, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        import torch.distributed as dist

        return state if dist.get_rank() == 0 else None
    return state


def _writer_rank() -> bool:
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def _tensors(state: Dict[str, Any]):
    """(unique contiguous CPU tensors by name, aliases: name -> the name holding its storage)."""
    import torch

    tensors, aliases, seen = {}, {}, {}
    for name, t in state.items():
        if not isinstance(t, torch.Tensor):
            raise ConfigurationError(f"state entry {name!r} is a {type(t).__name__}, not a tensor")
        t = t.detach()
        key = (t.device, t.data_ptr(), t.dtype, tuple(t.shape), t.stride()) if t.numel() else None
        if key is not None and key in seen:
            aliases[name] = seen[key]  # tied weights: stored once
            continue
        if key is not None:
            seen[key] = name
        tensors[name] = t.to("cpu").contiguous().clone() if t.numel() else t.to("cpu").contiguous()
    return tensors, aliases


def _sign(meta: dict, key: Optional[bytes]) -> dict:
    return {**meta, "signature": signing.document_mac(meta, key)} if key else meta


def save(
    path: str,
    module,
    *,
    builder: Builder,
    builder_kwargs: Optional[dict] = None,
    key: Optional[Union[str, bytes]] = None,
) -> Optional[str]:
    """Write ``module``'s weights (safetensors) and how to rebuild it (JSON) into directory ``path``.

    ``module``: an ``nn.Module`` (DDP unwrapped; FSDP2 gathered), a ``parallel.pipeline``, or a
    state dict.  ``builder(**builder_kwargs)`` must return the untrained network; the arguments
    must be plain JSON values.  In a distributed run every rank calls it and rank 0 writes.
    Returns the directory written, or None on the other ranks.
    """
    from safetensors.torch import save as st_save

    from . import store as model_store

    name = builder_name(builder)
    kwargs = dict(builder_kwargs or {})
    try:
        kwargs_json = json.loads(json.dumps(kwargs))
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"builder_kwargs must be plain JSON values (numbers, strings, lists, dicts): {exc}"
        ) from exc
    key_b = model_store.key_bytes(key)
    state = full_state(module)
    if state is None or not _writer_rank():
        return None
    tensors, aliases = _tensors(state)
    blob = st_save(tensors)
    meta = {
        "format": FORMAT,
        "builder": name,
        "builder_kwargs": kwargs_json,
        "weights": WEIGHTS,
        "bytes": len(blob),
        "sha256": hashlib.sha256(blob).hexdigest(),
        "aliases": aliases,
    }
    fs, root = model_store.filesystem(path)
    fs.create_dir(root, recursive=True)
    for fname, data in ((WEIGHTS, blob), (META, json.dumps(_sign(meta, key_b), indent=1).encode())):
        tmp = posixpath.join(root, f".{fname}.tmp-{os.getpid()}")
        with fs.open_output_stream(tmp) as fh:
            fh.write(data)
        fs.move(tmp, posixpath.join(root, fname))
    return path


def _read(fs, path: str, limit: int, what: str) -> bytes:
    """A file of the saved network: regular, at most ``limit`` bytes (:func:`safe_files.read_file`)."""
    from .files import read_file

    data = read_file(fs, path, limit, what)
    if data is None:
        raise FileNotFoundError(f"{path} does not exist")
    return data


def read_meta(path: str, key: Optional[Union[str, bytes]] = None) -> dict:
    """``model.json`` of a saved network, checked (format, names, signature when a key is set)."""
    from . import store as model_store

    fs, root = model_store.filesystem(path)
    try:
        meta = json.loads(_read(fs, posixpath.join(root, META), MAX_META_BYTES, f"{path}/{META}"))
    except (OSError, ValueError) as exc:
        raise CollectionError(f"{path} holds no readable {META}: {exc}") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise UnsafeModelError(f"{path}/{META} is not a saved network ({FORMAT})")
    key_b = model_store.key_bytes(key)
    if key_b is not None:
        want = _sign(meta, key_b).get("signature")
        if not signing.same(meta.get("signature"), want):
            raise UnsafeModelError(
                f"{path}/{META}: the signature does not verify with the signing key (unsigned, or "
                "changed after it was written)"
            )
    if (
        meta.get("weights") != WEIGHTS
        or not isinstance(meta.get("bytes"), int)
        or meta["bytes"] < 0
        or not isinstance(meta.get("aliases"), dict)
        or not isinstance(meta.get("builder_kwargs"), dict)
    ):
        raise UnsafeModelError(f"{path}/{META}: malformed record")
    builder_name(str(meta.get("builder")))
    return meta


def _pick_builder(recorded: str, builder: Optional[Builder], allowed: Optional[Sequence[Builder]]):
    if builder is not None:
        return _resolve(builder) if isinstance(builder, str) else builder
    for entry in allowed or ():
        if builder_name(entry) == recorded:
            return _resolve(entry) if isinstance(entry, str) else entry
    raise UnsafeModelError(
        f"the saved network names builder {recorded!r}, which this call did not allow: pass "
        f"builder=<the function> or allowed=[{recorded!r}] (a name only the file gives is never imported)"
    )


def _check_shapes(path: str, make: Callable[..., Any], meta: dict, state: Dict[str, Any]) -> None:
    """The network ``make(**builder_kwargs)`` builds, first on torch's ``meta`` device (no memory),
    must hold exactly the stored tensors' names and shapes: arguments read from an unsigned file
    (``hidden=10**9``) never allocate a network the weights do not fit."""
    import torch

    try:
        with torch.device("meta"):
            skeleton = make(**meta["builder_kwargs"])
        shapes = {k: tuple(v.shape) for k, v in skeleton.state_dict().items()}
    except Exception:  # noqa: BLE001 - a builder that cannot build on the meta device: checked after
        return
    stored = {k: tuple(v.shape) for k, v in state.items()}
    if shapes != stored:
        wrong = sorted(k for k in set(shapes) | set(stored) if shapes.get(k) != stored.get(k))
        raise CollectionError(
            f"the weights at {path} do not fit the network {meta['builder']}(**{meta['builder_kwargs']}) "
            f"builds ({len(wrong)} tensors differ, e.g. {wrong[:3]}: built "
            f"{[shapes.get(k) for k in wrong[:3]]}, stored {[stored.get(k) for k in wrong[:3]]}); "
            "nothing was allocated"
        )


def load(
    path: str,
    builder: Optional[Builder] = None,
    *,
    allowed: Optional[Sequence[Builder]] = None,
    key: Optional[Union[str, bytes]] = None,
    map_location: str = "cpu",
):
    """The network saved at ``path``, rebuilt by ``builder`` (or the allow-listed builder the file
    names) with the recorded arguments, its weights loaded strictly, in eval mode."""
    from safetensors import SafetensorError
    from safetensors.torch import load as st_load

    from . import store as model_store

    meta = read_meta(path, key)
    make = _pick_builder(meta["builder"], builder, allowed)
    fs, root = model_store.filesystem(path)
    blob = _read(fs, posixpath.join(root, WEIGHTS), meta["bytes"], f"{path}/{WEIGHTS}")
    if len(blob) != meta["bytes"] or hashlib.sha256(blob).hexdigest() != meta.get("sha256"):
        raise UnsafeModelError(f"{path}/{WEIGHTS} does not match its record in {META} (size or SHA-256)")
    try:
        state = st_load(blob)
    except (SafetensorError, ValueError) as exc:
        raise UnsafeModelError(f"{path}/{WEIGHTS} is not a valid safetensors file: {exc}") from exc
    for name, target in meta["aliases"].items():
        if target not in state:
            raise UnsafeModelError(f"{path}/{META}: alias {name!r} names no stored tensor")
        state[name] = state[target]
    _check_shapes(path, make, meta, state)
    module = make(**meta["builder_kwargs"])
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise CollectionError(
            f"the weights at {path} do not fit the network {meta['builder']}(**{meta['builder_kwargs']}) "
            f"builds: {exc}"
        ) from exc
    return module.to(map_location).eval()
