"""What every distributed backend is, and the helpers a backend's rank side uses.  [anywhere]

The backends themselves are in :mod:`sparkml_dist.runner.backends` (torch.distributed, Horovod)
and :mod:`.frameworks` (TensorFlow's ``TF_CONFIG``, ``jax.distributed``); nothing outside that room
tests a backend's name.

Example::

    class MyBackend(Backend):
        name, start_call = "mine", "my_init()"
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import os
import sys
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .. import protocol

# what a rank prints when it only noticed that a peer failed or left: a symptom, not a cause
COMMON_PEER_LOST = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    # a TCPStore client whose store went away with the rank (or driver) serving it
    "Connection was likely closed",
    "NCCL communicator was aborted",
    "ProcessGroupNCCL is aborted",
    # a collective that timed out waiting for a peer (gloo send/recv, NCCL watchdog): the peer is the story
    "Timed out waiting",
    "Watchdog caught collective operation timeout",
)


def close_fd(fd: Optional[int]) -> None:
    """Close the task's reserved port (or any descriptor) if it is still open: just before the
    framework binds the port again."""
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass


def collective_timeout() -> timedelta:
    """The run's collective timeout, inside a rank process."""
    return timedelta(seconds=float(os.environ.get(protocol.TIMEOUT_ENV, "600")))


def report_first_call(owners: Sequence[Any], name: str, on_call: Callable[[], None]) -> None:
    """Replace function ``name`` on each of ``owners`` (modules) by one that calls ``on_call()`` first.

    The attribute is looked up at call time, so it works however the function imported it.
    """
    original = getattr(owners[0], name)
    if getattr(original, "_sparkml_dist_hook", False):
        return

    @functools.wraps(original)
    def hooked(*args, **kwargs):
        on_call()
        return original(*args, **kwargs)

    hooked._sparkml_dist_hook = True  # type: ignore[attr-defined]
    for owner in owners:
        setattr(owner, name, hooked)


class Backend:
    """What differs between distributed backends (see the module docstring)."""

    name = ""
    start_call = ""  # the call that joins the rendezvous, as errors name it
    peer_lost: Tuple[str, ...] = COMMON_PEER_LOST
    # every rank's task binds and listens on a port of its own (peers[r]["port"]), not only rank 0's:
    # for frameworks whose workers each serve their own address (TensorFlow's gRPC servers)
    every_rank_listens = False
    # the rank closes the task's listening socket and the framework binds the port again (TensorFlow,
    # JAX): the port is one no other process of the host can be handed meanwhile (network.reserve_port)
    framework_rebinds_port = False
    # set in each rank process unless its environment (the executor's, or env=) already has them
    env_defaults: Dict[str, str] = {}
    extra = ""  # the package extra that installs the framework (named when it is missing)
    reserved_env: Tuple[str, ...] = ()  # what the backend sets for each rank itself: refused in env=
    comm_names: Tuple[str, ...] = ()  # the comm= settings it takes (none: it has its own)
    compressions: Tuple[Optional[str], ...] = (None,)  # the comm= compressions it can do
    torch_group = False  # its ranks hold a torch.distributed process group (sparkml_dist.keras needs one)
    # its ranks can be forked from a warm pool (runner.tasks.warm_pool) that ran preload(): the
    # framework's import leaves no thread or runtime a fork cannot copy
    warm_ranks = False
    summary = ""  # what a script run on it is, for the command line's help
    roles: Tuple[str, ...] = ()  # the roles it runs beside the workers (runner.roles), if any
    roles_start_call = ""  # with roles: the call that joins the rendezvous on the rank running the function

    def comm_env(self, settings: Dict[str, Any]) -> Dict[str, str]:
        """Variables the framework reads of ``comm=`` settings when it starts (before the function)."""
        return {}

    def check_installed(self) -> None:
        """Driver: raise ConfigurationError when the backend cannot run here."""

    def rank_env(
        self,
        rank: int,
        peers: Sequence[dict],
        gpus: Optional[List[str]],
        collective_timeout: float,
        nodes: str = "host",
        ranks_per_task: int = 1,
    ) -> Tuple[Dict[str, str], Dict[str, Any]]:
        """Task: (rank ``rank``'s rendezvous environment, extra fields of its start message);
        ``nodes``: what LOCAL_RANK counts (:func:`rendezvous.node_keys`)."""
        raise NotImplementedError

    def preload(self) -> None:
        """A warm pool process: the imports that :meth:`prepare` makes, nothing a fork cannot copy
        (no thread, no CUDA context, no socket)."""

    def spare_preload(self) -> None:
        """A spare rank process (:mod:`~sparkml_dist.runner.tasks.replace`), while it waits to take
        a lost rank's place: what the function will import at once, imported off the critical
        path (in the spare itself: nothing is forked after it)."""

    def prepare(self, rank: int, world: int, store_fd: Optional[int]) -> Any:
        """Rank process, before the start message; returns state held for the process's life."""
        raise NotImplementedError

    def finish(self, state: Any) -> None:
        """Rank process, after the function returned and its result was written, before it exits."""

    def join(
        self, state: Any, rank: int, message: dict, store_fd: Optional[int], reached: Callable[[], None]
    ) -> Any:
        """Rank process, after the start message: make ``reached()`` run when the rank joins."""
        raise NotImplementedError

    def role_main(self, state: Any) -> Optional[Callable[[str], Any]]:
        """Rank process, with roles: what a rank that runs no user code runs instead of the
        function (given its work directory; it returns once the run is over), or None: the function."""
        return None


def after_import(module: str, on_import: Callable[[Any], None]) -> None:
    """Call ``on_import(mod)`` once ``module`` has been imported in this process (now, if it is).

    For checks on a framework that the user's function imports, without importing it first (a
    framework's import costs seconds).
    """
    if module in sys.modules:
        on_import(sys.modules[module])
        return
    sys.meta_path.insert(0, _AfterImport(module, on_import))


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds ``module`` with the other finders, and runs ``on_import`` after its loader has."""

    def __init__(self, module: str, on_import: Callable[[Any], None]) -> None:
        self.module, self.on_import = module, on_import

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.module:
            return None
        sys.meta_path.remove(self)  # once, and the finders below do the finding
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader, on_import = spec.loader, self.on_import
        original = loader.exec_module

        def exec_module(mod):
            original(mod)
            on_import(mod)

        loader.exec_module = exec_module
        return spec
