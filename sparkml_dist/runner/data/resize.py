"""A world that changes size in place: what must hold for its rows to be dealt again.  [anywhere]

With ``executor_loss="replace"`` and ``min_np`` the world of a run may shrink to any size from
``min_np`` to ``np`` and grow back, without a restart (:mod:`sparkml_dist.runner.elastic`).  Each
time, the rows' streams are dealt to the ranks of the new size (:meth:`.shard.Shard.redeal`) and
the loaders go on at their position with the same global batch (:meth:`.loader.ShardLoader.redeal`),
so every size must share both evenly: checked here, on the driver (the streams) and when a loader
is made (the global batch), not at the first loss.

Example::

    check_streams(4, min_np=2, world=4)          # refused: 3 ranks cannot share 4 streams (use 12)
    check_global_batch(24, data_world=4)          # in a rank of such a run: 2, 3 and 4 divide 24
"""

from __future__ import annotations

import math

from ...errors import ConfigurationError
from ..protocol import resize_settings


def check_streams(count: int, min_np: int, world: int) -> None:
    """Every world size from ``min_np`` to ``world`` divides the ``count`` streams."""
    uneven = [k for k in range(min_np, world + 1) if count % k]
    if uneven:
        raise ConfigurationError(
            f"the rows are cut into streams={count}, which a world of {uneven[0]} ranks (one this run "
            f"may shrink to, min_np={min_np}) cannot share evenly: pass "
            f"run_with_data(streams={math.lcm(*range(min_np, world + 1))}) or a multiple"
        )


def check_global_batch(global_batch: int, data_world: int) -> None:
    """In a rank of a run that may shrink in place: every size it may take shares the global batch."""
    min_np, _ = resize_settings()
    uneven = [k for k in range(min_np or data_world, data_world + 1) if global_batch % k]
    if uneven:
        raise ConfigurationError(
            f"global_batch_size={global_batch} cannot be shared evenly by a world of {uneven[0]} ranks, "
            f"which this run may shrink to (min_np={min_np}): use a global batch that every size "
            f"from min_np to {data_world} divides (e.g. {math.lcm(*range(min_np or 1, data_world + 1))})"
        )
