"""The backends whose framework brings its own rendezvous: TensorFlow and JAX.  [anywhere]

* ``backend="tensorflow"``: each rank gets a ``TF_CONFIG`` naming every rank as a worker (each at
  the port its own task bound, task index = rank), so ``tf.distribute.MultiWorkerMirroredStrategy()``
  joins the run with no argument, as under spark-tensorflow-distributor's ``MirroredStrategyRunner``.
  ``TF_USE_LEGACY_KERAS=1`` is set (unless the environment says otherwise): ``tf.keras`` is then the
  Keras 2 API of ``tf-keras``, the one the documents' programs use and the one that trains under
  that strategy. Keras 3's ``model.fit`` on the TensorFlow backend fails under it (TensorFlow 2.21,
  Keras 3.15: "Attempt to convert a value (PerReplica ...)"), so the rank refuses that call with
  the fix instead of the deep traceback.
* ``backend="jax"``: the runner calls ``jax.distributed.initialize`` before the function (the
  coordinator is rank 0's address, CPU collectives through gloo); a second call by the program, or
  by ``keras.distribution.initialize()``, is harmless. ``KERAS_BACKEND=jax`` and Keras's
  ``KERAS_DISTRIBUTION_*`` variables are set, and when the function imports Keras every rank gets
  the same global seed (the rest of what ``keras.distribution.initialize()`` does), so
  ``keras.distribution.DataParallel`` runs as is, with or without that call.

Both close the task's socket (bound, not listening) just before the framework binds its port
(TensorFlow's gRPC server, JAX's coordinator); that port is one the kernel hands no other process
meanwhile and that no socket holds on any address (``network.reserve_port``). The other ranks wait
until rank 0's server accepts before their framework connects to it: a connection refused first
would cost them gRPC's reconnect backoff, a second (seen in up to half the warm runs). TensorFlow's
servers listen on every interface of the host (TF_CONFIG workers have no bind address; JAX's
coordinator is bound to the rank's own address): docs/security.md says so.

Example::

    env, _ = backends.get("tensorflow").rank_env(0, peers, None, collective_timeout=600)
    json.loads(env["TF_CONFIG"])["task"]          # {"type": "worker", "index": 0}
"""

from __future__ import annotations

import json
import os
from typing import Dict, Sequence

from ...errors import ConfigurationError
from ...host import network
from .. import protocol, rendezvous
from .base import COMMON_PEER_LOST, Backend, after_import, close_fd, report_first_call

KERAS3_ON_TF_FIX = (
    "Keras 3's model.fit on the TensorFlow backend fails under MultiWorkerMirroredStrategy "
    "(TensorFlow 2.21, Keras 3.15: 'Attempt to convert a value (PerReplica ...)'). Under "
    "backend='tensorflow' use the Keras 2 API: tf.keras with TF_USE_LEGACY_KERAS=1 (the runner's "
    "default; pip install 'sparkml_dist[tensorflow]' brings tf-keras), i.e. `import tensorflow as "
    "tf; tf.keras.Sequential(...)` instead of `import keras`. For Keras 3, run the program on "
    "backend='torch' with `import sparkml_dist.keras as hvd`, or on backend='jax' with "
    "keras.distribution.DataParallel."
)


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _placement_env(rank: int, peers: Sequence[dict], nodes: str, ranks_per_task: int) -> Dict[str, str]:
    """RANK, WORLD_SIZE, LOCAL_RANK, ... and the rank's GPUs, without torch's store variables."""
    keys = rendezvous.node_keys([p["host"] for p in peers], nodes, ranks_per_task)
    env = rendezvous.rank_env(rank, keys, peers[0]["host"], peers[0]["port"], [p["gpus"] for p in peers])
    for torch_only in ("MASTER_ADDR", "MASTER_PORT", rendezvous.AGENT_STORE_ENV):
        env.pop(torch_only)
    return env


def _installed(module: str, backend: str, extra: str) -> None:
    import importlib.util
    import sys

    if importlib.util.find_spec(module) is None:
        raise ConfigurationError(
            f"backend={backend!r} needs {module}, which is not installed in this Python "
            f"({sys.executable}): pip install 'sparkml_dist[{extra}]' on the driver and the executors"
        )


class TensorFlowBackend(Backend):
    """``tf.distribute.MultiWorkerMirroredStrategy`` from a ``TF_CONFIG`` per rank."""

    name = "tensorflow"
    start_call = "tf.distribute.MultiWorkerMirroredStrategy()"
    every_rank_listens = True
    framework_rebinds_port = True
    extra = "tensorflow"
    reserved_env = ("TF_CONFIG",)
    summary = "TF_CONFIG for MultiWorkerMirroredStrategy"
    roles = ("ps", "chief")  # ParameterServerStrategy (runner.roles, backends.tf_roles)
    roles_start_call = "tf.distribute.ParameterServerStrategy(...)"
    env_defaults = {"TF_USE_LEGACY_KERAS": "1", "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "1"}
    peer_lost = COMMON_PEER_LOST + (
        "Collective ops is aborted by",
        "failed to connect to all addresses",
        "Socket closed",
        "UnavailableError",
    )

    def check_installed(self) -> None:
        _installed("tensorflow", self.name, self.extra)

    def rank_env(self, rank, peers, gpus, collective_timeout, nodes="host", ranks_per_task=1, roles=None):
        env = _placement_env(rank, peers, nodes, ranks_per_task)
        addresses = [_address(p["host"], p["port"]) for p in peers]
        if roles is None:  # every rank a worker of MultiWorkerMirroredStrategy
            cluster, (role, index) = {"worker": addresses}, ("worker", rank)
        else:  # the chief, the workers, the parameter servers (runner.roles)
            cluster, (role, index) = roles.cluster(addresses), roles.of(rank)
            env[protocol.ROLE_ENV] = role
        env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": role, "index": index}})
        return env, {}

    warm_ranks = True

    def preload(self):
        import tensorflow  # noqa: F401 - its runtime starts with the first op or strategy, in the rank

    def prepare(self, rank, world, store_fd):
        import tensorflow  # noqa: F401 - seconds, while the task writes the shard

    def join(self, state, rank, message, store_fd, reached):
        from tensorflow.python.distribute import collective_all_reduce_strategy as mwms

        if os.environ.get(protocol.ROLE_ENV):  # ParameterServerStrategy's roles
            from . import tf_roles

            return tf_roles.join(os.environ[protocol.ROLE_ENV], store_fd, reached)
        closed = []

        def joining() -> None:  # the strategy's gRPC server binds the port this rank was given
            if not closed:  # once: the number may name another file later
                closed.append(True)
                close_fd(store_fd)
            reached()
            if rank != 0:  # worker 0 leads: the others register with it first
                leader = json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"][0]
                _wait_for(leader, _start_wait())

        report_first_call([mwms.CollectiveAllReduceStrategy], "__init__", joining)
        after_import("keras", _refuse_keras3_fit)
        return state

    def role_main(self, state):
        return getattr(state, "serve", None)  # a worker's or parameter server's tf_roles.Server


def _start_wait() -> float:
    """How long a rank waits for its peers to join: the run's start_timeout, else its collective one."""
    return float(os.environ.get(protocol.START_TIMEOUT_ENV) or 0) or float(os.environ[protocol.TIMEOUT_ENV])


def _wait_for(address: str, within: float) -> None:
    """Until the server at ``address`` ("host:port", "[v6]:port") accepts (or ``within`` s passed:
    the framework then retries as it would have)."""
    host, port = address.rsplit(":", 1)
    network.wait_listening(host.strip("[]"), int(port), within)


def _refuse_keras3_fit(keras) -> None:
    """Keras 3 on the TensorFlow backend: refuse ``fit`` under a multi-worker strategy, with the fix."""
    model = getattr(keras, "Model", None)
    if model is None or not hasattr(model, "fit"):
        return  # not Keras 3 (an old Keras, or a shim): nothing to guard
    original = model.fit

    def fit(self, *args, **kwargs):
        import tensorflow as tf
        from tensorflow.python.distribute import collective_all_reduce_strategy as mwms

        strategy = getattr(self, "distribute_strategy", None) or tf.distribute.get_strategy()
        if keras.backend.backend() == "tensorflow" and isinstance(strategy, mwms.CollectiveAllReduceStrategy):
            raise ConfigurationError(KERAS3_ON_TF_FIX)
        return original(self, *args, **kwargs)

    fit.__doc__ = original.__doc__
    model.fit = fit


def refuse_multi_worker_strategy(backend: str) -> None:
    """Under a backend other than TensorFlow's there is no ``TF_CONFIG``: a
    ``MultiWorkerMirroredStrategy`` would quietly make each rank a cluster of one, training alone.
    Refuse it at construction, with the fix."""

    def guard(tf) -> None:
        from tensorflow.python.distribute import collective_all_reduce_strategy as mwms

        def refuse() -> None:
            if "TF_CONFIG" not in os.environ:
                raise ConfigurationError(
                    f"tf.distribute.MultiWorkerMirroredStrategy under backend={backend!r} would make "
                    "every rank a cluster of one, each training alone: run this function with "
                    "backend='tensorflow' (BarrierRunner(..., backend='tensorflow'), or "
                    "sparkml_dist.tensorflow_distributor.MirroredStrategyRunner), which gives each "
                    "rank its TF_CONFIG"
                )

        report_first_call([mwms.CollectiveAllReduceStrategy], "__init__", refuse)

    after_import("tensorflow", guard)


class JaxBackend(Backend):
    """``jax.distributed``: rank 0's process is the coordinator, on its task's port."""

    name = "jax"
    start_call = "jax.distributed.initialize()"
    framework_rebinds_port = True
    extra = "jax"
    summary = "jax.distributed initialized first"
    reserved_env = (
        "KERAS_DISTRIBUTION_JOB_ADDRESSES",
        "KERAS_DISTRIBUTION_NUM_PROCESSES",
        "KERAS_DISTRIBUTION_PROCESS_ID",
    )
    env_defaults = {"KERAS_BACKEND": "jax"}
    peer_lost = COMMON_PEER_LOST + (
        "detected fatal errors",
        "coordination service",
        "DEADLINE_EXCEEDED",
    )

    def check_installed(self) -> None:
        _installed("jax", self.name, self.extra)

    def rank_env(self, rank, peers, gpus, collective_timeout, nodes="host", ranks_per_task=1):
        env = _placement_env(rank, peers, nodes, ranks_per_task)
        env.update(
            KERAS_DISTRIBUTION_JOB_ADDRESSES=_address(peers[0]["host"], peers[0]["port"]),
            KERAS_DISTRIBUTION_NUM_PROCESSES=str(len(peers)),
            KERAS_DISTRIBUTION_PROCESS_ID=str(rank),
        )
        return env, {}

    warm_ranks = True

    def preload(self):
        self.prepare(0, 1, None)  # the import and a setting: no backend is made before the rank's

    def prepare(self, rank, world, store_fd):
        import jax

        jax.config.update("jax_cpu_collectives_implementation", "gloo")

    def join(self, state, rank, message, store_fd, reached):
        import jax

        coordinator = os.environ["KERAS_DISTRIBUTION_JOB_ADDRESSES"]
        world = int(os.environ["WORLD_SIZE"])
        wait = _start_wait()
        if rank == 0:
            close_fd(store_fd)  # the coordinator binds the port the peers were given
        else:
            _wait_for(coordinator, wait)
        jax.distributed.initialize(
            coordinator_address=coordinator,
            num_processes=world,
            process_id=rank,
            coordinator_bind_address=coordinator if rank == 0 else None,
            initialization_timeout=max(1, int(wait)),
        )
        jax.distributed.initialize = _initialized(rank, world)
        after_import("keras", _agree_keras_seed)  # the rest of keras.distribution.initialize()
        reached()
        return state


def _agree_keras_seed(keras) -> None:
    """What ``keras.distribution.initialize()`` does after ``jax.distributed.initialize``: every
    process gets one global seed (Keras sums one drawn on each; here the run's id gives it, the same
    on every rank, with no collective), so a program written for one process with several devices
    (``DataParallel`` without the call, as Keras's guide writes it) starts from the same weights on
    every rank.  A seed the program set itself stands; one it sets later wins, as with Keras."""
    import hashlib

    rng = getattr(getattr(keras, "src", None), "utils", None)
    rng = getattr(rng, "rng_utils", None)
    if rng is None or rng.get_random_seed() is not None or keras.backend.backend() != "jax":
        return
    run = os.environ.get(protocol.RUN_ENV, "")
    rng.set_random_seed(int.from_bytes(hashlib.sha256(run.encode()).digest()[:4], "big"))


def _initialized(rank: int, world: int):
    """``jax.distributed.initialize`` once the runner has called it: a program's own call (or
    ``keras.distribution.initialize()``'s) joins nothing new; one that asks for another place fails."""

    def initialize(coordinator_address=None, num_processes=None, process_id=None, **_):
        if (num_processes not in (None, world)) or (process_id not in (None, rank)):
            raise ConfigurationError(
                f"jax.distributed.initialize(num_processes={num_processes}, process_id={process_id}): "
                f"the runner already initialized this rank as process {rank} of {world} "
                "(backend='jax'); call it with no arguments, or not at all"
            )

    return initialize
