"""Run a training *script* on every rank, as torchrun would.  [rank]

``run_script(source, path, argv)`` executes the script's source as ``__main__`` with ``sys.argv``
set, in the rank process the runner started (MASTER_ADDR, RANK, ... already set).  The source is
read on the driver and shipped with the run, so the script need not exist on the executors.
A ``sys.exit(0)`` (or None) is success; any other exit status fails the rank.  The script's folder
and any ``--py-files``/``--archives`` travel with it (:mod:`sparkml_dist.runner.script_files`), so
it imports its sibling modules as it would under torchrun.
"""

from __future__ import annotations

import os
import sys
from typing import List, Optional

from . import protocol
from .script_files import ScriptFiles, install


def run_script(source: str, path: str, argv: List[str], files: Optional[ScriptFiles] = None) -> None:
    if files is not None:  # the runner's files privately; archives into the working directory
        install(files, os.environ.get(protocol.WORKDIR_ENV, os.getcwd()), os.getcwd())
    code = compile(source, path, "exec")
    sys.argv = [path, *argv]
    namespace = {"__name__": "__main__", "__file__": path, "__builtins__": __builtins__}
    try:
        exec(code, namespace)  # noqa: S102 - running the user's own training script is the point
    except SystemExit as stop:
        if stop.code not in (None, 0):
            raise
