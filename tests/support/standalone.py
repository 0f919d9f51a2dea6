"""A real Spark standalone cluster on loopback: one master and two workers started from the
pip-installed pyspark (``bin/spark-class``), each a separate JVM; torn down with its processes."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, proc: subprocess.Popen, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the standalone master exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise TimeoutError(f"the standalone master did not listen on {port} within {timeout}s")


class StandaloneCluster:
    """``with StandaloneCluster(workers=2) as url:`` -> ``spark://127.0.0.1:PORT``."""

    def __init__(self, workers: int = 2, cores: int = 1, memory: str = "1g") -> None:
        import pyspark

        self.home = os.path.dirname(pyspark.__file__)
        self.workers, self.cores, self.memory = workers, cores, memory
        self.procs = []
        self.workdir = tempfile.mkdtemp(prefix="sparkml_dist_standalone_")

    def _start(self, *args: str) -> subprocess.Popen:
        env = dict(
            os.environ,
            SPARK_HOME=self.home,
            PYSPARK_PYTHON=sys.executable,
            SPARK_LOG_DIR=self.workdir,
            SPARK_WORKER_DIR=self.workdir,
        )
        log = open(os.path.join(self.workdir, f"{args[0].rsplit('.', 1)[-1]}-{len(self.procs)}.log"), "w")
        proc = subprocess.Popen(
            [os.path.join(self.home, "bin", "spark-class"), *args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def __enter__(self) -> str:
        port = _free_port()
        master = self._start(
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webui-port",
            str(_free_port()),
        )
        _wait_port(port, master)
        self.url = f"spark://127.0.0.1:{port}"
        for _ in range(self.workers):
            self._start(
                "org.apache.spark.deploy.worker.Worker",
                self.url,
                "--host",
                "127.0.0.1",
                "--cores",
                str(self.cores),
                "--memory",
                self.memory,
                "--webui-port",
                str(_free_port()),
                "--work-dir",
                self.workdir,
            )
        return self.url

    def __exit__(self, *exc) -> None:
        for proc in reversed(self.procs):  # workers (and their executors) first, then the master
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)
