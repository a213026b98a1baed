"""A real Redis Cluster for the fleet tests: 3 masters and 3 replicas, each a
`redis-server` process on a free loopback port in a temporary directory,
joined with `redis-cli --cluster create --cluster-replicas 1`."""
from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest


NODE_TIMEOUT_MS = 2000   # how long a silent master goes before its replica takes over


def _cli(port: int, *args: str, timeout: float = 10) -> str:
    out = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(port), *args],
                         capture_output=True, text=True, timeout=timeout)
    return out.stdout


def _synced(port: int) -> bool:
    info = _cli(port, "info", "replication")
    if "role:slave" in info:
        return "master_link_status:up" in info
    return "role:master" in info


class RedisCluster:
    def __init__(self, root: Path, n_masters: int = 3, policy: str = "noeviction"):
        if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server; .ci/run does)")
        self.root = root
        # Twelve distinct ports, all held until the last is picked (one at a time, the kernel
        # could hand the same port out twice: a node's port and another's bus port collided).
        # Not port+10000 for the bus: that may be taken or > 65535.
        ports = distinct_ports(4 * n_masters)
        self.ports = ports[: 2 * n_masters]
        self.bus_ports = dict(zip(self.ports, ports[2 * n_masters:]))
        self.procs: dict[int, subprocess.Popen] = {}
        try:
            for port in self.ports:
                self.start_node(port, policy)
            for port in self.ports:
                self._wait(port, lambda p: _cli(p, "ping").strip() == "PONG")
            nodes = [f"127.0.0.1:{p}" for p in self.ports]
            out = subprocess.run(["redis-cli", "--cluster", "create", *nodes, "--cluster-replicas", "1",
                                  "--cluster-yes"], capture_output=True, text=True, timeout=60)
            if out.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed:\n{out.stdout}\n{out.stderr}")
            self.wait_ok()
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        return "redis://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def start_node(self, port: int, policy: str = "noeviction") -> None:
        d = self.root / str(port)
        d.mkdir(parents=True, exist_ok=True)
        self.procs[port] = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(d),
             "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
             "--cluster-port", str(self.bus_ports[port]), "--repl-diskless-sync-delay", "0",
             "--cluster-node-timeout", str(NODE_TIMEOUT_MS), "--appendonly", "no", "--save", "",
             "--maxmemory-policy", policy, "--daemonize", "no", "--logfile", str(d / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def _wait(self, port: int, ok, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ok(port):
                return
            time.sleep(0.1)
        log = self.root / str(port) / "redis.log"
        tail = log.read_text()[-2000:] if log.exists() else ""
        raise RuntimeError(f"redis node {port} did not become ready:\n{tail}")

    def wait_ok(self, timeout: float = 30) -> None:
        """Until every live node says cluster_state:ok and every replica has synced
        (a replica that never synced cannot take over from its master)."""
        live = [p for p, proc in self.procs.items() if proc.poll() is None]
        for port in live:
            self._wait(port, lambda p: "cluster_state:ok" in _cli(p, "cluster", "info"), timeout)
        for port in live:
            self._wait(port, _synced, timeout)

    def masters(self) -> list[int]:
        """Ports of the live masters."""
        out = _cli(next(p for p, proc in self.procs.items() if proc.poll() is None), "cluster", "nodes")
        found = []
        for line in out.splitlines():
            parts = line.split()
            if len(parts) > 2 and "master" in parts[2] and "fail" not in parts[2]:
                found.append(int(parts[1].split("@")[0].rsplit(":", 1)[1]))
        return found

    def master_of(self, key: str) -> int:
        """The port of the live master that owns ``key``'s slot."""
        live = next(p for p, proc in self.procs.items() if proc.poll() is None)
        slot = int(_cli(live, "cluster", "keyslot", key).strip())
        for line in _cli(live, "cluster", "nodes").splitlines():
            parts = line.split()
            if len(parts) > 8 and "master" in parts[2] and "fail" not in parts[2]:
                for span in parts[8:]:
                    lo, _, hi = span.partition("-")
                    if lo.isdigit() and int(lo) <= slot <= int(hi or lo):
                        return int(parts[1].split("@")[0].rsplit(":", 1)[1])
        raise RuntimeError(f"no live master owns {key!r} (slot {slot})")

    def stop_all(self) -> None:
        """Every node shut down, its data saved first (``SHUTDOWN SAVE``): the whole
        cluster out of reach, as in an outage, and back whole by :meth:`start_all`."""
        for port, proc in self.procs.items():
            if proc.poll() is None:
                _cli(port, "shutdown", "save")
        for proc in self.procs.values():
            proc.wait(30)

    def start_all(self) -> None:
        for port in self.ports:
            self.start_node(port)
        for port in self.ports:
            self._wait(port, lambda p: _cli(p, "ping").strip() == "PONG")

    def kill(self, port: int) -> None:
        """SIGKILL one node (no chance to hand anything over)."""
        self.procs[port].send_signal(signal.SIGKILL)
        self.procs[port].wait()

    def wait_failover(self, dead: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            masters = self.masters()
            if dead not in masters and len(masters) == len(self.ports) // 2:
                self.wait_ok(timeout)
                return
            time.sleep(0.2)
        raise RuntimeError(f"no replica took over from {dead}")

    def keys(self, pattern: str) -> list[str]:
        out = []
        for port in self.masters():
            out += [k for k in _cli(port, "--scan", "--pattern", pattern, timeout=30).split() if k]
        return out

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def distinct_ports(n: int) -> list[int]:
    """n free loopback ports, no two the same."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory):
    for attempt in range(3):  # a port another process took between our pick and redis's bind: pick again
        try:
            cluster = RedisCluster(tmp_path_factory.mktemp("redis-cluster"))
            break
        except RuntimeError as err:
            if "Address already in use" not in str(err) or attempt == 2:
                raise
    yield cluster
    cluster.stop()


@pytest.fixture
def fleet(redis_cluster):
    """The session's cluster, emptied for this test."""
    for port in redis_cluster.masters():
        _cli(port, "flushall")
    return redis_cluster
