"""Where each rank's time goes: data wait, compute, communication, per step.  [anywhere]

On every rank (:mod:`.clock`, :mod:`.hooks`) a step clock counts steps and splits their time into
**data wait** (inside the runner's loader), **communication** (inside the collectives, waiting for
the slowest peer included) and **compute** (the rest), with no change to the function: steps come
from :func:`step` when the function marks them, else from the runner's loader, else from what the
framework does once a step (a ``DistributedDataParallel`` forward, Horovod's
``DistributedOptimizer.step``, a Keras ``fit`` batch).  Each rank sends small cumulative summaries
to the driver over the run's channel (:data:`.clock.SUMMARY_S` apart); the driver
(:mod:`.report`) names a straggler while the run goes on and builds the run's report,
:func:`sparkml_dist.runner.last_run`.

Example::

    from sparkml_dist.runner import step

    for x, y in my_batches:             # a loop the runner cannot see
        with step():
            loss = train_on(x, y)
"""

from .clock import step

__all__ = ["step"]
