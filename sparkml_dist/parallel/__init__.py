"""Models larger than one device: pipeline stages over the ranks.  [rank]

Runs inside a function given to :class:`~sparkml_dist.runner.BarrierRunner` (or any
``torch.distributed`` job).  :func:`pipeline` splits a ``torch.nn.Sequential`` (or a module whose
``blocks`` list holds all its layers) into ``stages`` runs of consecutive layers, one or more per
rank, on PyTorch's own ``torch.distributed.pipelining``: each mini-batch is cut into
``microbatches`` that flow through the stages under a schedule:

* ``schedule="simple"``: all forwards, then all backwards (GPipe fill-drain);
* ``schedule="interleaved"``: forwards and backwards interleaved (1F1B); with several stages per
  rank, interleaved 1F1B — less idle time (the pipeline "bubble") and fewer activations kept.

The split balances ``"compute"`` (forward+backward time of each layer, measured on
``example_input`` on rank 0) or ``"memory"`` (parameters, gradients and kept activations), or is
given as layer counts; every rank gets the same split.  ``data_parallel=D`` runs D replicas of the
pipeline (world size = pipeline ranks x D) on a 2-D ``DeviceMesh``; each stage's gradients are
averaged over its replicas.

Example (2 ranks, 2 stages)::

    from sparkml_dist.runner import BarrierRunner, checkpoint
    from sparkml_dist.parallel import pipeline

    def train(steps):
        import torch
        model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(16)])
        pipe = pipeline(model, stages=2, microbatches=4, loss_fn=torch.nn.functional.mse_loss,
                        example_input=torch.zeros(64, 512))
        opt = torch.optim.Adam(pipe.parameters(), lr=1e-3)
        for step in range(steps):
            X, y = batch(step)                    # the same mini-batch on every rank of a replica
            opt.zero_grad()
            loss = pipe.step(X, y)                # the mini-batch's mean loss, on every rank
            opt.step()
        return pipe.full_state_dict()             # the unsplit model's state dict, on rank 0

    state = BarrierRunner(np=2).run(train, 100)

Sharded data parallelism (FSDP2) needs nothing from this package: call
``torch.distributed.fsdp.fully_shard`` inside the function (see ``examples/fsdp_train.py``).
"""

from ..stages import partition

__all__ = ["pipeline", "Pipeline", "partition"]


def __getattr__(name):  # torch is imported when a pipeline is built, not when the driver plans
    if name in ("pipeline", "Pipeline"):
        from . import pipe as _module

        return getattr(_module, name)
    raise AttributeError(name)
