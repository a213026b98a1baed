"""The Redis Cluster under a fleet: connecting, per-node pipelines, retries.

Every fleet operation goes through :class:`Cluster`, which

* groups keys by the master that owns their slot and sends each group as one
  pipeline on that master's own connection, the groups in parallel: one round
  trip per question, whatever the number of keys;
* ends a write group with ``WAIT`` on the same connection, so a write counts
  as done only once a replica has it too (a master killed right after cannot
  take it with it when its replica is promoted);
* retries a group that met a failover (connection refused or reset, a
  timeout, ``MOVED``, ``CLUSTERDOWN``, ``TRYAGAIN``) after refreshing the slot
  map, until a bounded deadline; every write we make is idempotent (``SET
  NX``, a compare-and-set that accepts its own value), so a retry of a write
  that did land is harmless;
* and, when the cluster cannot be reached at all, says so once and reports
  :class:`FleetUnavailable`, which the store turns into local-only work.

Socket timeouts are short, so an unreachable fleet costs seconds, never a hang.
"""
from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import (AskError, BusyLoadingError, ClusterDownError, MasterDownError, MovedError,
                              ReadOnlyError, RedisClusterException, RedisError, ResponseError,
                              SlotNotCoveredError, TryAgainError)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..errors import StoreError

CONNECT_TIMEOUT_S = 1.0     # per node: an address nobody answers on costs this, not a hang
SOCKET_TIMEOUT_S = 5.0      # per reply: a 16 MB pipeline of pages arrives well within it
RETRY_DEADLINE_S = 20.0     # a failover (cluster-node-timeout plus election) fits in this
WAIT_TIMEOUT_MS = 2000      # how long a write waits for its replica's acknowledgement
RECONNECT_S = 30.0          # an unreachable fleet is tried again after this long
SAFE_POLICY = "noeviction"  # any other maxmemory-policy may evict pages a ref needs

# Key layout (store/fleet.py's docstring): pages, manifests, publishing markers,
# refs and their logs (hash-tagged by name), host heartbeats, hosts by weights.
PAGE, MANIFEST, PENDING = "ctx:p:", "ctx:m:", "ctx:pm:"
REF, REFLOG, HOST, WEIGHTS = "ctx:r:", "ctx:rl:", "ctx:host:", "ctx:w:"

# What a failover looks like from a client: retried after refreshing the slot map.
_TRANSIENT = (RedisConnectionError, RedisTimeoutError, MovedError, AskError, ClusterDownError,
              TryAgainError, MasterDownError, SlotNotCoveredError, ReadOnlyError, BusyLoadingError,
              ConnectionError, OSError)


class FleetError(StoreError):
    """The fleet refused to start or an operation on it failed for good."""


class FleetUnavailable(FleetError):
    """The fleet cannot be reached now: callers fall back to the local store."""


def parse_url(url: str) -> list[tuple[str, int]]:
    """``redis://host:port[,host:port...]`` (the scheme may be left out) -> [(host, port)]."""
    if not isinstance(url, str) or not url.strip():
        raise FleetError(f"fleet address must be redis://host:port[,host:port...], got {url!r}")
    text = url.strip()
    if "://" in text:
        scheme, text = text.split("://", 1)
        if scheme != "redis":
            raise FleetError(f"fleet address {url!r}: only redis:// is supported")
    nodes = []
    for part in text.rstrip("/").split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise FleetError(f"fleet address {url!r}: {part.strip()!r} is not host:port")
        nodes.append((host.strip("[]"), int(port)))
    return nodes


class Cluster:
    def __init__(self, url: str, *, deadline_s: float = RETRY_DEADLINE_S):
        self.url = url
        self.nodes = parse_url(url)
        self.deadline_s = deadline_s
        self.retries = 0                 # groups sent again after a failover (for stats and tests)
        self._rc: RedisCluster | None = None
        self._down_since: float | None = None
        self._warned = False
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(8, thread_name_prefix="ctx-fleet")
        try:
            self.client()  # connect now: a misconfigured cluster refuses at start, an absent one warns
        except FleetUnavailable:
            pass

    # -- connection ---------------------------------------------------------------------
    def client(self) -> RedisCluster:
        """The cluster client; FleetUnavailable while the fleet cannot be reached."""
        with self._lock:
            if self._rc is not None:
                return self._rc
            if self._down_since is not None and time.monotonic() - self._down_since < RECONNECT_S:
                raise FleetUnavailable(f"fleet {self.url} is unreachable")
            try:
                rc = RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in self.nodes],
                                  socket_connect_timeout=CONNECT_TIMEOUT_S, socket_timeout=SOCKET_TIMEOUT_S,
                                  require_full_coverage=True)
            except (RedisError, RedisClusterException, OSError) as e:
                self._mark_down(e)
                raise FleetUnavailable(f"fleet {self.url} is unreachable") from None
            try:
                _check_policy(rc, self.url)
            except BaseException:
                rc.close()
                raise
            self._rc, self._down_since = rc, None
            if self._warned:
                print(f"ctx: fleet {self.url} is reachable again", file=sys.stderr, flush=True)
                self._warned = False
            return rc

    @property
    def online(self) -> bool:
        try:
            self.client()
        except FleetUnavailable:
            return False
        return True

    def _mark_down(self, err: BaseException) -> None:
        """Forget the client and warn, once until the fleet is back (caller holds the lock)."""
        if self._rc is not None:
            try:
                self._rc.close()
            except RedisError:
                pass
        self._rc, self._down_since = None, time.monotonic()
        if not self._warned:
            self._warned = True
            reason = str(err).splitlines()[0] if str(err) else type(err).__name__
            print(f"ctx: warning: fleet {self.url} is unreachable ({reason}); "
                  f"working from the local store only", file=sys.stderr, flush=True)

    def close(self) -> None:
        with self._lock:
            if self._rc is not None:
                self._rc.close()
                self._rc = None
        self._pool.shutdown(wait=False)

    # -- grouped pipelines -----------------------------------------------------------------
    def grouped(self, keys: Sequence[str], queue: Callable, *, wait: bool = False) -> dict[str, object]:
        """Run ``queue(pipe, key)`` (one command per key) for every key, one pipeline per
        master, the masters in parallel; with ``wait``, each pipeline ends with WAIT.
        Returns {key: reply}. Retries failovers until the deadline."""
        keys = list(dict.fromkeys(keys))
        out: dict[str, object] = {}
        todo = keys
        deadline = time.monotonic() + self.deadline_s
        while todo:
            groups = self._by_master(todo)
            futures = [self._pool.submit(self._run_group, node, ks, queue, wait) for node, ks in groups]
            failed: list[str] = []
            last: BaseException | None = None
            for (node, ks), fut in zip(groups, futures):
                try:
                    out.update(fut.result())
                except _TRANSIENT as e:
                    failed.extend(ks)
                    last = e
            todo = failed
            if todo:
                self._after_failure(last, deadline)
        return out

    def on_key(self, key: str, queue: Callable, *, wait: bool = False) -> object:
        """One key's command (through ``queue(pipe, key)``) on its master; its reply."""
        return self.grouped([key], queue, wait=wait)[key]

    def scan(self, pattern: str) -> list[str]:
        """Every key matching ``pattern`` on every master (keys as str)."""
        def go(rc):
            found = []
            for node in rc.get_primaries():
                found.extend(_text(k) for k in rc.get_redis_connection(node).scan_iter(match=pattern, count=1000))
            return found
        return self._attempt(go)

    def _attempt(self, fn):
        deadline = time.monotonic() + self.deadline_s
        while True:
            try:
                return fn(self.client())
            except _TRANSIENT as e:
                self._after_failure(e, deadline)

    def _after_failure(self, err: BaseException | None, deadline: float) -> None:
        """Refresh the slot map and wait a little before a retry; past the deadline, give up."""
        self.retries += 1
        if time.monotonic() >= deadline:
            with self._lock:
                self._mark_down(err or TimeoutError("no reply"))
            raise FleetUnavailable(f"fleet {self.url} did not recover within {self.deadline_s:.0f} s") from None
        time.sleep(0.2)
        try:
            self.client().nodes_manager.initialize()
        except (RedisError, RedisClusterException, OSError):
            pass  # the cluster is still electing; the next attempt tells

    def _by_master(self, keys: list[str]) -> list[tuple[object, list[str]]]:
        rc = self.client()
        groups: dict[str, tuple[object, list[str]]] = {}
        for key in keys:
            node = rc.nodes_manager.get_node_from_slot(rc.keyslot(key))
            groups.setdefault(node.name, (node, []))[1].append(key)
        return list(groups.values())

    def _run_group(self, node, keys: list[str], queue: Callable, wait: bool) -> dict[str, object]:
        pipe = self.client().get_redis_connection(node).pipeline(transaction=False)
        for key in keys:
            queue(pipe, key)
        wanted = self._replicas_of(keys[0]) if wait else 0
        if wait:
            pipe.execute_command("WAIT", wanted, WAIT_TIMEOUT_MS)
        replies = pipe.execute(raise_on_error=False)
        if wait and isinstance(replies[-1], int) and replies[-1] < wanted:
            # Not on a replica yet: sent again (idempotent) until one has it, or the deadline.
            raise RedisTimeoutError(f"no replica of {node.name} acknowledged the write")
        for reply in replies:
            if isinstance(reply, _TRANSIENT):
                raise reply
            if isinstance(reply, ResponseError):
                raise FleetError(f"fleet {self.url}: {reply}")
        return dict(zip(keys, replies))

    def _replicas_of(self, key: str) -> int:
        """How many replicas a write to this key's master should wait for (at most 1)."""
        rc = self.client()
        owners = rc.nodes_manager.slots_cache.get(rc.keyslot(key), [])
        return min(1, max(0, len(owners) - 1))


def _check_policy(rc: RedisCluster, url: str) -> None:
    """Refuse a cluster that could evict a page a ref needs (docs/fleet.md)."""
    for node in rc.get_primaries():
        try:
            found = rc.get_redis_connection(node).config_get("maxmemory-policy")
        except ResponseError as e:
            raise FleetError(f"fleet {url}: cannot read maxmemory-policy on {node.name} ({e}); "
                             f"the fleet needs maxmemory-policy {SAFE_POLICY}") from None
        policy = next((_text(v) for k, v in found.items() if _text(k) == "maxmemory-policy"), "unknown")
        if policy != SAFE_POLICY:
            raise FleetError(f"fleet {url}: {node.name} has maxmemory-policy {policy}, which may evict "
                             f"pages a snapshot needs; set maxmemory-policy {SAFE_POLICY} (see docs/fleet.md)")


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
