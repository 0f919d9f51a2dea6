"""A Spark Connect server in its own process on a free port, as ``sbin/start-connect-server.sh``
starts one: the Connect pass's second pytest-xdist worker talks to it over ``sc://`` (a remote
server, as a cluster's users reach one), while the first worker starts pyspark's in-process
``connect:local[2]`` server, which always binds port 15002, so both kinds are tested in one pass."""

import os
import socket
import subprocess
import sys
import tempfile
import time

import pyspark

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _accepts(port):
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(("127.0.0.1", port)) == 0


class ConnectServer:
    """``with ConnectServer("local[2]", conf, java_options) as url:`` -> ``sc://127.0.0.1:<port>``."""

    def __init__(self, master, conf, java_options="", start_timeout=180.0):
        self.master, self.conf, self.java_options = master, dict(conf), java_options
        self.start_timeout = start_timeout
        self.proc = self.log = None

    def _spawn(self, port):
        spark_home = os.path.dirname(pyspark.__file__)
        argv = [os.path.join(spark_home, "bin", "spark-submit"), "--class", SERVER_CLASS]
        argv += ["--master", self.master, "--name", "sparkml_dist-tests-connect"]
        if self.java_options:
            argv += ["--driver-java-options", self.java_options]
        conf = {**self.conf, "spark.connect.grpc.binding.address": "127.0.0.1"}
        conf["spark.connect.grpc.binding.port"] = str(port)
        for key, value in conf.items():
            argv += ["--conf", f"{key}={value}"]
        env = {**os.environ, "SPARK_HOME": spark_home, "PYSPARK_PYTHON": sys.executable}
        self.log = tempfile.NamedTemporaryFile(prefix="connect-server-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=env)

    def __enter__(self):
        for _ in range(3):  # a free port taken by someone else between the pick and the bind
            port = _free_port()
            self._spawn(port)
            end = time.monotonic() + self.start_timeout
            while self.proc.poll() is None and time.monotonic() < end and not _accepts(port):
                time.sleep(0.5)
            if self.proc.poll() is None and _accepts(port):
                return f"sc://127.0.0.1:{port}"
            self._stop()
        with open(self.log.name, errors="replace") as fh:
            tail = fh.read()[-3000:]
        raise RuntimeError(f"the Spark Connect server did not start; its log ({self.log.name}):\n{tail}")

    def _stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def __exit__(self, *exc):
        self._stop()
        self.log.close()
        os.unlink(self.log.name)
