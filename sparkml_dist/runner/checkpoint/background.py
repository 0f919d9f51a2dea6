"""A checkpoint written off the training path: the copy to host memory, and the one writer thread.  [rank]

Used by :func:`sparkml_dist.runner.checkpoint.save` with ``blocking=False``: :func:`to_host` copies
the state (tensors storage by storage, so views and tied weights stay shared and ``torch.save``
writes the same bytes as from the live state), then :class:`BackgroundWrite` runs the write in a
thread and keeps its failure for the next ``wait``.  One write at a time: the caller waits before
starting the next.

Example::

    writer = BackgroundWrite()
    writer.start(step, to_host(state), lambda copy: write(copy))   # back to training at once
    writer.wait()                                                  # the step, or raises
"""

from __future__ import annotations

import threading
from typing import Any, Optional

from ...errors import CollectionError


def to_host(state: Any) -> Any:
    """A copy of ``state`` whose tensors live in fresh host memory, storages shared as before."""
    import copy

    import torch

    storages: dict = {}

    def host(t):
        if type(t) not in (torch.Tensor, torch.nn.Parameter):  # DTensor and other subclasses: as they are
            return copy.deepcopy(t)
        if t.is_sparse or t.layout != torch.strided:  # sparse / quantized layouts: a plain copy
            return t.detach().to("cpu", copy=True)
        src = t.untyped_storage()
        key = (src.device, src.data_ptr(), src.nbytes())
        dst = storages.get(key)
        if dst is None:
            dst = storages[key] = src.cpu() if src.device.type != "cpu" else src.clone()
        out = torch.empty(0, dtype=t.dtype)
        out.set_(dst, t.storage_offset(), t.size(), t.stride())
        if isinstance(t, torch.nn.Parameter):  # saved as a Parameter, as a blocking save would
            return torch.nn.Parameter(out, requires_grad=t.requires_grad)
        return out

    def walk(obj):
        if isinstance(obj, torch.Tensor):
            return host(obj)
        if isinstance(obj, dict):
            out = copy.copy(obj)  # keeps OrderedDict and its _metadata (state_dict versions)
            for k, v in obj.items():
                out[k] = walk(v)
            return out
        if isinstance(obj, list):
            return [walk(v) for v in obj]
        if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
            return tuple(walk(v) for v in obj)
        if isinstance(obj, (str, bytes, int, float, bool, type(None), torch.dtype, torch.device)):
            return obj
        return copy.deepcopy(obj)

    return walk(state)


class BackgroundWrite:
    """The one background write of this process (rank 0), and the failure of the last one."""

    def __init__(self):
        self._thread: Optional[threading.Thread] = None
        self._step: Optional[int] = None
        self._error: Optional[BaseException] = None

    def start(self, step: int, copy: Any, write) -> None:
        def run():
            try:
                write(copy)
            except BaseException as exc:  # kept for wait(): the previous checkpoint stays the latest
                self._error = exc

        self._step, self._error = step, None
        self._thread = threading.Thread(target=run, name=f"checkpoint-step-{step}", daemon=True)
        self._thread.start()

    def wait(self) -> Optional[int]:
        thread, self._thread = self._thread, None
        if thread is None:
            return None
        thread.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise CollectionError(
                f"the background checkpoint of step {self._step} was not written "
                f"({type(error).__name__}: {error}); LATEST still names the previous checkpoint"
            ) from error
        return self._step
