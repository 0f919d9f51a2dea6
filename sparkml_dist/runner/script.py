"""Run a training *script* on every rank, as torchrun would.  [executor: inside a rank process]

``run_script(source, path, argv)`` executes the script's source as ``__main__`` with ``sys.argv``
set, in the rank process the runner started (MASTER_ADDR, RANK, ... already set).  The source is
read on the driver and shipped with the run, so the script need not exist on the executors.
A ``sys.exit(0)`` (or None) is success; any other exit status fails the rank.
"""

from __future__ import annotations

import sys
from typing import List


def run_script(source: str, path: str, argv: List[str]) -> None:
    code = compile(source, path, "exec")
    sys.argv = [path, *argv]
    namespace = {"__name__": "__main__", "__file__": path, "__builtins__": __builtins__}
    try:
        exec(code, namespace)  # noqa: S102 - running the user's own training script is the point
    except SystemExit as stop:
        if stop.code not in (None, 0):
            raise
