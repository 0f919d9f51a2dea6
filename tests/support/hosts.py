"""A cluster of three "hosts" on this machine: network namespaces joined by a bridge, each with its
own address on a private /24, its own ``/etc/hosts`` and (for the processes started in it) its own
hostname.  The driver (this test process and the JVM it starts) runs in ``driver``; a Spark
standalone master and a worker run in ``host1``; a second worker in ``host2``.

Nothing crosses hosts over loopback: loopback in one namespace is not the other's.  Faults are real:
``kill_host`` kills every process of a namespace, ``cut``/``restore`` take a host's link down and up,
``block_ports`` drops packets at the driver's namespace (a firewall rule), ``add_worker`` starts a
worker late (a cluster that grows).

Links can be shaped like a cluster's Ethernet: ``shape("host1", "1gbit")`` gives the host's link
that rate in both directions (``tc``'s token bucket, ``tbf``, on both ends of its veth: what it
sends and what it receives), ``delay="0.5ms"`` adds that one-way delay to what it sends (``netem``:
refused naming the missing kernel module where the kernel has none, as on the machine this was
built on), ``unshape`` takes it off.  :meth:`Hosts.throughput` measures a link with a real TCP
stream.

Needs root and ``ip`` (iproute2) with ``unshare``; :func:`unavailable` says why not, for the skip.
Everything is torn down on exit, also after a failed test: processes, namespaces, veths, the
bridge, ``/etc/netns`` entries and work directories.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

SUBNET = "10.231.7"  # a private /24 used only between these namespaces
CLONE_NEWNET = 0x40000000
MASTER_PORT = 7077
# the driver's own ports (RPC, block manager) and the executors' block manager: fixed so that
# block_ports can leave Spark's traffic through (the driver's connections to the master and to
# the executors come back from those source ports)
SPARK_CONF = {
    "spark.driver.port": "7078",
    "spark.driver.blockManager.port": "7079",
    "spark.blockManager.port": "7080",
}


def unavailable() -> Optional[str]:
    """Why network namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns); this machine runs the tests as a user"
    for tool in ("ip", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"'{tool}' (iproute2 / util-linux) is not installed"
    probe = f"sdprobe{os.getpid() % 100000}"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if done.returncode != 0:
        return f"'ip netns add' failed: {done.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


# this process's network namespace when the module is imported (the machine's own): the bridge
# and the veths' host ends live there, whichever namespace the process enters later
_HOME_NS = os.open("/proc/self/ns/net", os.O_RDONLY)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """``ip ARGS`` in the machine's own network namespace."""
    home = f"--net=/proc/{os.getpid()}/fd/{_HOME_NS}"
    done = subprocess.run(
        ["nsenter", home, "ip", *args], capture_output=True, text=True, pass_fds=(_HOME_NS,)
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def _tc(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """``tc ARGS`` in the machine's own network namespace (``-n NS`` for a host's side)."""
    home = f"--net=/proc/{os.getpid()}/fd/{_HOME_NS}"
    done = subprocess.run(
        ["nsenter", home, "tc", *args], capture_output=True, text=True, pass_fds=(_HOME_NS,)
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"tc {' '.join(args)}: {done.stderr.strip()}")
    return done


_UNITS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "bit": 1.0}


def bits_per_s(rate: str) -> float:
    """``"1gbit"`` -> 1e9 (tc's units: bit, kbit, mbit, gbit)."""
    text = str(rate).strip().lower()
    for unit, scale in _UNITS.items():
        if text.endswith(unit):
            try:
                value = float(text[: -len(unit)])
            except ValueError:
                break
            if value > 0:
                return value * scale
    raise ValueError(f"rate {rate!r}: give a positive number with a unit of {list(_UNITS)}, e.g. '1gbit'")


# what the receiving end of Hosts.throughput runs: counts the bytes of one connection, prints bits/s
_RECEIVE = """
import socket, sys, time
server = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
conn, _ = server.accept()
buf, got, first = bytearray(1 << 20), 0, None
while True:
    n = conn.recv_into(buf)
    if not n:
        break
    first = first or time.perf_counter()
    got += n
print(got * 8 / (time.perf_counter() - first), flush=True)
"""
_SEND = """
import socket, sys, time
conn = socket.create_connection((sys.argv[1], int(sys.argv[2])))
chunk, end = bytes(1 << 20), time.monotonic() + float(sys.argv[3])
while time.monotonic() < end:
    conn.sendall(chunk)
conn.close()
"""


def _setns(path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns({path})")
    finally:
        os.close(fd)


class Host:
    """One namespace: ``name`` (its hostname), ``ns`` (the namespace), ``address``, ``link`` (the
    bridge side of its veth: down = the host is cut off)."""

    def __init__(self, prefix: str, name: str, index: int) -> None:
        self.name, self.index = name, index
        self.ns = f"{prefix}-{name}"
        self.address = f"{SUBNET}.{10 + index}"
        self.link = f"{prefix}v{index}"

    def pids(self) -> List[int]:
        out = _ip("netns", "pids", self.ns, check=False).stdout.split()
        return [int(p) for p in out if p.isdigit()]


class Hosts:
    """``with Hosts() as cluster:`` -> the cluster, this process inside ``cluster.driver``'s
    namespace; ``cluster.master_url`` is the standalone master."""

    names = ("driver", "host1", "host2")

    built: List["Hosts"] = []  # every cluster made in this process, for the leftovers check

    def __init__(self, cores: int = 2, memory: str = "1g", spark: bool = True) -> None:
        import pyspark

        self.home = os.path.dirname(pyspark.__file__)
        self.spark = spark  # False: the network alone (namespaces, bridge, addresses)
        self.prefix = f"sd{os.getpid() % 10000}{len(Hosts.built)}"
        Hosts.built.append(self)
        self.bridge = f"{self.prefix}br"
        self.hosts: Dict[str, Host] = {n: Host(self.prefix, n, i) for i, n in enumerate(self.names)}
        self.cores, self.memory = cores, memory
        self.workdir = tempfile.mkdtemp(prefix="sparkml_dist_hosts_")
        self.procs: List[subprocess.Popen] = []
        self._inodes: set = set()  # the namespaces' inodes: what a process inside one points at
        self.master_url = f"spark://{self['host1'].address}:{MASTER_PORT}"

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    @property
    def driver(self) -> Host:
        return self.hosts["driver"]

    # -- the network -------------------------------------------------------------------------
    def _build(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("link", "set", self.bridge, "up")
        lines = ["127.0.0.1 localhost"] + [f"{h.address} {h.name}" for h in self.hosts.values()]
        for h in self.hosts.values():
            _ip("netns", "add", h.ns)
            _ip("link", "add", h.link, "type", "veth", "peer", "name", "eth0", "netns", h.ns)
            _ip("link", "set", h.link, "master", self.bridge)
            _ip("link", "set", h.link, "up")
            _ip("-n", h.ns, "addr", "add", f"{h.address}/24", "dev", "eth0")
            _ip("-n", h.ns, "link", "set", "eth0", "up")
            _ip("-n", h.ns, "link", "set", "lo", "up")
            self._inodes.add(os.stat(f"/var/run/netns/{h.ns}").st_ino)
            etc = os.path.join("/etc/netns", h.ns)  # `ip netns exec` mounts these over /etc
            os.makedirs(etc, exist_ok=True)
            with open(os.path.join(etc, "hosts"), "w") as fh:
                fh.write("\n".join(lines) + "\n")

    def enter(self, host: str = "driver") -> None:
        """Move this process's (main thread's) network into ``host``: what it starts runs there."""
        _setns(f"/var/run/netns/{self.hosts[host].ns}")

    def leave(self) -> None:
        """Back to the machine's own network namespace."""
        _setns(f"/proc/{os.getpid()}/fd/{_HOME_NS}")

    # -- processes ---------------------------------------------------------------------------
    def start(
        self, host: str, argv: List[str], env: Optional[dict] = None, log: str = ""
    ) -> subprocess.Popen:
        """Start ``argv`` in ``host``'s namespace under its own hostname."""
        h = self.hosts[host]
        wrapped = [
            "ip",
            "netns",
            "exec",
            h.ns,
            "unshare",
            "--uts",
            "sh",
            "-c",
            'hostname "$0"; exec "$@"',
            h.name,
        ]
        out = open(os.path.join(self.workdir, f"{log or os.path.basename(argv[0])}-{h.name}.log"), "ab")
        proc = subprocess.Popen(
            wrapped + list(argv), env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        out.close()
        self.procs.append(proc)
        return proc

    def _spark_env(self, host: str) -> dict:
        return dict(
            os.environ,
            SPARK_HOME=self.home,
            PYSPARK_PYTHON=sys.executable,
            SPARK_LOG_DIR=self.workdir,
            SPARK_WORKER_DIR=os.path.join(self.workdir, host),
            SPARK_NO_DAEMONIZE="1",
        )

    def start_worker(self, host: str) -> subprocess.Popen:
        h = self.hosts[host]
        argv = [
            os.path.join(self.home, "bin", "spark-class"),
            "org.apache.spark.deploy.worker.Worker",
            self.master_url,
            "--host",
            h.address,
            "--cores",
            str(self.cores),
            "--memory",
            self.memory,
            "--webui-port",
            "0",
            "--work-dir",
            os.path.join(self.workdir, host),
        ]
        return self.start(host, argv, self._spark_env(host), log="worker")

    def _wait_listening(self, host: str, port: int, proc: subprocess.Popen, timeout: float = 120.0) -> None:
        address = self.hosts[host].address
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the process on {host} exited with {proc.returncode}: see {self.workdir}")
            with socket.socket() as s:  # this process is in the driver's namespace: a cross-host probe
                s.settimeout(1.0)
                if s.connect_ex((address, port)) == 0:
                    return
            time.sleep(0.5)
        raise TimeoutError(f"nothing listened on {address}:{port} within {timeout}s: see {self.workdir}")

    def __enter__(self) -> "Hosts":
        try:
            self._build()
            if not self.spark:
                return self
            self.enter("driver")
            master = self.start(
                "host1",
                [
                    os.path.join(self.home, "bin", "spark-class"),
                    "org.apache.spark.deploy.master.Master",
                    "--host",
                    self["host1"].address,
                    "--port",
                    str(MASTER_PORT),
                    "--webui-port",
                    "0",
                ],
                self._spark_env("host1"),
                log="master",
            )
            self._wait_listening("host1", MASTER_PORT, master)
            self.start_worker("host1")
            self.start_worker("host2")
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        return self

    # -- faults ------------------------------------------------------------------------------
    def kill_host(self, host: str) -> int:
        """SIGKILL every process in ``host``'s namespace (a machine that died); how many."""
        pids = [p for p in self.hosts[host].pids() if p != os.getpid()]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return len(pids)

    def cut(self, host: str) -> None:
        """Take ``host``'s link down: packets to and from it are lost, no connection is closed."""
        _ip("link", "set", self.hosts[host].link, "down")

    def restore(self, host: str) -> None:
        _ip("link", "set", self.hosts[host].link, "up")

    def block_ports(self, source: Optional[str] = None) -> None:
        """A firewall rule in the driver's namespace: TCP to any driver port but Spark's own
        (:data:`SPARK_CONF`) is dropped silently, from ``source`` (a host name) or from every host."""
        ns = self.driver.ns
        # `lookup local` must come after the rules for them to apply to packets for this host
        _ip("-n", ns, "rule", "add", "pref", "100", "lookup", "local", check=False)
        _ip("-n", ns, "rule", "del", "pref", "0", check=False)
        base = ["-n", ns, "rule", "add", "pref", "10", "iif", "eth0", "ipproto", "tcp"]  # let through
        _ip(*base, "dport", SPARK_CONF["spark.driver.port"], "lookup", "local")
        _ip(*base, "dport", SPARK_CONF["spark.driver.blockManager.port"], "lookup", "local")
        _ip(*base, "sport", str(MASTER_PORT), "lookup", "local")
        _ip(*base, "sport", SPARK_CONF["spark.blockManager.port"], "lookup", "local")
        frm = ["from", self.hosts[source].address] if source else []
        drop = ["-n", ns, "rule", "add", "pref", "20", *frm, "iif", "eth0", "ipproto", "tcp", "dport"]
        _ip(*drop, "1024-65534", "blackhole")  # iproute2 6.1 refuses 65535 (never an ephemeral port)

    # -- links like a cluster's ---------------------------------------------------------------
    def shape(self, host: str, rate: str, delay: Optional[str] = None) -> None:
        """Give ``host``'s link ``rate`` (``"1gbit"``, ``"10gbit"``) each way, and ``delay`` (one
        way, on what it sends) where the kernel has ``netem``.  Replaces an earlier shaping."""
        h = self.hosts[host]
        bps = bits_per_s(rate)
        # the bucket holds 2 ms of the rate and at least a few of veth's 64 KiB (GSO) packets:
        # smaller, and big packets wait for tokens the bucket can never hold
        burst = str(max(256 * 1024, int(bps / 8 * 0.002)))
        tbf = ["tbf", "rate", rate, "burst", burst, "latency", "50ms"]
        self.unshape(host)
        if delay is not None:
            done = _tc("-n", h.ns, "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "netem",
                       "delay", delay, check=False)  # fmt: skip
            if done.returncode != 0:
                raise RuntimeError(
                    f"shape({host!r}, delay={delay!r}): this kernel cannot add delay ({done.stderr.strip()}: "
                    "the sch_netem module is missing); shape the rate alone (delay=None)"
                )
            _tc("-n", h.ns, "qdisc", "add", "dev", "eth0", "parent", "1:1", "handle", "10:", *tbf)
        else:
            _tc("-n", h.ns, "qdisc", "add", "dev", "eth0", "root", *tbf)  # what the host sends
        _tc("qdisc", "add", "dev", h.link, "root", *tbf)  # what the bridge sends it

    def unshape(self, host: str) -> None:
        """``host``'s link back to the veth's own speed."""
        h = self.hosts[host]
        _tc("-n", h.ns, "qdisc", "del", "dev", "eth0", "root", check=False)
        _tc("qdisc", "del", "dev", h.link, "root", check=False)

    def shaping(self, host: str) -> List[str]:
        """The queueing disciplines on ``host``'s link, as ``tc qdisc show`` prints them."""
        h = self.hosts[host]
        lines = _tc("-n", h.ns, "qdisc", "show", "dev", "eth0").stdout.splitlines()
        return lines + _tc("qdisc", "show", "dev", h.link).stdout.splitlines()

    def throughput(self, src: str, dst: str, seconds: float = 2.0, port: int = 5301) -> float:
        """Bits/s one TCP stream carries from ``src`` to ``dst`` for ``seconds`` (real sockets in
        the two namespaces, the receiver counting from its first byte)."""
        address = self.hosts[dst].address
        wrap = ["ip", "netns", "exec"]
        rx = subprocess.Popen(
            wrap + [self.hosts[dst].ns, sys.executable, "-c", _RECEIVE, address, str(port)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            if rx.stdout.readline().strip() != "ready":
                raise RuntimeError(f"the receiver on {dst} did not start")
            subprocess.run(
                wrap + [self.hosts[src].ns, sys.executable, "-c", _SEND, address, str(port), str(seconds)],
                check=True, timeout=seconds + 60,
            )  # fmt: skip
            out, _ = rx.communicate(timeout=60)
            return float(out.strip())
        finally:
            if rx.poll() is None:
                rx.kill()
                rx.wait()

    def unblock_ports(self) -> None:
        ns = self.driver.ns
        for pref in ("10", "20"):
            while _ip("-n", ns, "rule", "del", "pref", pref, check=False).returncode == 0:
                pass

    # -- teardown ----------------------------------------------------------------------------
    def __exit__(self, *exc) -> None:
        if self.spark:
            self.leave()
        for h in reversed(list(self.hosts.values())):
            self.kill_host(h.name)  # the driver's too: pyspark's JVM outlives its stopped session
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for h in self.hosts.values():
            _ip("netns", "del", h.ns, check=False)  # its veth end goes with it, and the peer too
            _ip("link", "del", h.link, check=False)
            shutil.rmtree(os.path.join("/etc/netns", h.ns), ignore_errors=True)
        _ip("link", "del", self.bridge, check=False)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def leftovers(self) -> List[str]:
        """What of this cluster still exists: namespaces, links, directories, processes."""
        left = [h.ns for h in self.hosts.values() if h.ns in _ip("netns", "list", check=False).stdout]
        links = _ip("link", "show", check=False).stdout
        left += [n for n in [self.bridge] + [h.link for h in self.hosts.values()] if f" {n}" in links]
        left += [
            p
            for p in [self.workdir] + [f"/etc/netns/{h.ns}" for h in self.hosts.values()]
            if os.path.exists(p)
        ]
        return left + [f"process {pid} ({name})" for pid, name in self._processes_inside()]

    def _processes_inside(self) -> List[tuple]:
        """Processes still in one of this cluster's namespaces (by the namespace's inode)."""
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                net = os.readlink(f"/proc/{pid}/ns/net")
                if int(net[5:-1]) in self._inodes and int(pid) != os.getpid():
                    with open(f"/proc/{pid}/comm") as fh:
                        found.append((int(pid), fh.read().strip()))
            except (OSError, ValueError):
                continue
        return found


class Autoscaler:
    """Grows the cluster the way an autoscaler does: starts ``host``'s worker once the driver has
    had tasks waiting for a slot (a pending task of an active stage) for a second."""

    def __init__(self, cluster: Hosts, spark, host: str) -> None:
        import threading

        self.cluster, self.spark, self.host = cluster, spark, host
        self.grew_at: Optional[float] = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _pending(self) -> int:
        tracker = self.spark.sparkContext.statusTracker()
        waiting = 0
        for stage_id in tracker.getActiveStageIds():
            info = tracker.getStageInfo(stage_id)
            if info is not None:
                waiting += info.numTasks - info.numActiveTasks - info.numCompletedTasks - info.numFailedTasks
        return waiting

    def _watch(self) -> None:
        since = None
        while not self._stop.wait(0.25):
            if self._pending() > 0:
                since = since or time.monotonic()
                if time.monotonic() - since >= 1.0:
                    self.grew_at = time.monotonic()
                    self.cluster.start_worker(self.host)
                    return
            else:
                since = None

    def __enter__(self) -> "Autoscaler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)
