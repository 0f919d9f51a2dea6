"""A decommissioned executor's notice: the ranks save at one step and hand over.  [rank]

When the driver sees an executor of the run being decommissioned (:mod:`sparkml_dist.runner.decommission`),
it tells rank 0's task, which leaves :data:`~sparkml_dist.runner.protocol.NOTICE_FILE` in rank 0's
work directory.  The ranks then agree on a step through the run's store, at
:func:`sparkml_dist.runner.checkpoint.due`, the boundary every rank already calls:

* rank 0, at the first ``due(step)`` after the notice, writes ``step + MARGIN`` under :data:`KEY`;
* every rank reads :data:`KEY` at each ``due`` (one store lookup a step, only in runs armed for it:
  ``HANDOVER_ENV``); ``due`` is True at that step on every rank, whatever ``every`` says;
* at that step's :func:`~sparkml_dist.runner.checkpoint.save` rank 0 writes the checkpoint and
  marks it in the store; the others wait for the mark, and every rank raises :class:`HandedOver`.

The driver then starts the run again from that checkpoint on executors that are not leaving (not
counted against ``max_restarts``): no completed step is trained twice.  Why ``MARGIN`` steps ahead
is enough: rank 0 writes the key before its next step's collective, and no rank finishes that
collective (and reaches its next ``due``) before rank 0 joins it; so every rank reads the key at
the latest one step after rank 0 wrote it.  This needs a collective of every rank in each step
(DDP's all-reduce, FSDP's reduce-scatter, an explicit all_reduce), as data-parallel training has.
"""

from __future__ import annotations

import os
import time
from typing import Optional

from .. import protocol, rank_channel

KEY = "sparkml_dist/handover/step"
SAVED_KEY = "sparkml_dist/handover/saved"
READ_KEY = "sparkml_dist/handover/read"  # how many ranks saw the mark: rank 0 (the store) leaves last
MARGIN = 2  # steps between rank 0 reading the notice and the step every rank saves at


class HandedOver(Exception):
    """Raised on every rank after the handover checkpoint: the run goes on elsewhere from it."""


class _Handover:
    def __init__(self) -> None:
        self.step: Optional[int] = None  # the agreed step, once read

    @staticmethod
    def armed() -> bool:
        if os.environ.get(protocol.HANDOVER_ENV) != "1":
            return False
        import torch.distributed as dist

        return dist.is_available() and dist.is_initialized()

    @staticmethod
    def _store():
        import torch.distributed as dist

        return dist.distributed_c10d._get_default_store()

    def due(self, step: int) -> bool:
        """True at the agreed step (see the module docstring); raises past it (no save was made)."""
        if self.step is None:
            if not self.armed():
                return False
            store = self._store()
            if int(os.environ.get("RANK", "0")) == 0 and _noticed():
                agreed = int(store.compare_set(KEY, "", str(step + MARGIN)))
                rank_channel.send_log(
                    f"[sparkml_dist] an executor of the run is decommissioned: the ranks save at step "
                    f"{agreed} and go on elsewhere from it"
                )
            if not store.check([KEY]):
                return False
            self.step = int(store.get(KEY))
        if step > self.step:  # the function did not save at the agreed step: leave now
            raise HandedOver(f"handed over after step {self.step} (no checkpoint saved at it)")
        return step == self.step

    def after_save(self, step: int, rank: int) -> None:
        """Called by ``save`` after rank 0's write: at the agreed step, every rank leaves."""
        if self.step is None or step != self.step:
            return
        store = self._store()
        if rank == 0:  # its process serves the store: it leaves once every rank saw the mark
            store.set(SAVED_KEY, str(step))
            others = int(os.environ.get("WORLD_SIZE", "1")) - 1
            while int(store.add(READ_KEY, 0)) < others:
                time.sleep(0.01)
        else:  # the file is written when the mark is there
            store.wait([SAVED_KEY])
            store.add(READ_KEY, 1)
        raise HandedOver(f"handed over at step {step}: the checkpoint of step {step} is saved")


def _noticed() -> bool:
    workdir = os.environ.get(protocol.WORKDIR_ENV)
    return bool(workdir) and os.path.exists(os.path.join(workdir, protocol.NOTICE_FILE))


_state = _Handover()


def due(step: int) -> bool:
    return _state.due(step)


def after_save(step: int, rank: int) -> None:
    _state.after_save(step, rank)


def due_now(step: int) -> bool:
    """``step`` is the agreed handover step (read already)."""
    return _state.step is not None and step == _state.step
