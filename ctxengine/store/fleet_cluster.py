"""The Redis Cluster under a fleet: connecting, per-node pipelines, retries.

Every fleet operation goes through :class:`Cluster`, which

* groups keys by the master that owns their slot and sends each group as one
  pipeline on that master's own connection, the groups in parallel: one round
  trip per question, whatever the number of keys;
* ends a write group with ``WAIT`` on the same connection, so a write counts
  as done only once a replica has it too (a master killed right after cannot
  take it with it when its replica is promoted);
* retries a group that met a failover (connection refused or reset, a
  timeout, ``MOVED``, ``CLUSTERDOWN``, ``TRYAGAIN``, any other error of the
  redis client but a command's own refusal) after refreshing the slot map;
  every write we make is idempotent (``SET NX``, a compare-and-set that
  accepts its own value), so a retry of a write that did land is harmless;
* tells a failover from an outage: while some node answers, a master that
  does not is being replaced, and the group is retried until the promoted
  replica takes it (at most ``RETRY_DEADLINE_S``); when no node answers at all
  for ``UNREACHABLE_S``, the cluster is down;
* and, when it is down, says so once and reports :class:`FleetUnavailable`
  (the store works local-only; a server refuses named contexts with a 503,
  docs/fleet.md), trying the cluster again at most every ``PROBE_S``.

One client lives as long as the Cluster and is never closed under a thread
that may be using it: after an outage its slot map is refreshed, not
replaced. Socket timeouts are short, so an unreachable fleet costs seconds,
never a hang.
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

from ..errors import StoreError, UnavailableError

CONNECT_TIMEOUT_S = 1.0     # per node: an address nobody answers on costs this, not a hang
SOCKET_TIMEOUT_S = 5.0      # per reply: a 16 MB pipeline of pages arrives well within it
RETRY_DEADLINE_S = 20.0     # a failover (cluster-node-timeout plus election) fits in this
UNREACHABLE_S = 3.0         # no node at all answers this long: the cluster is down, not failing over
PROBE_S = 1.0               # a cluster found down is tried again at most this often
RETRY_PAUSE_S = 0.1         # between a failed attempt and the next (after a slot map refresh)
REPLICAS_TTL_S = 1.0        # how long a master's count of its replicas is trusted
WAIT_TIMEOUT_MS = 2000      # how long a write waits for its replica's acknowledgement
SAFE_POLICY = "noeviction"  # any other maxmemory-policy may evict pages a ref needs

# Key layout (store/fleet.py's docstring): pages, manifests, publishing markers,
# refs and their logs (hash-tagged by name), host heartbeats, hosts by weights
# and by (weights, LoRA adapter).
PAGE, MANIFEST, PENDING = "ctx:p:", "ctx:m:", "ctx:pm:"
REF, REFLOG, HOST, WEIGHTS, WEIGHTS_LORA = "ctx:r:", "ctx:rl:", "ctx:host:", "ctx:w:", "ctx:wl:"

# What a failover looks like from a client: retried after refreshing the slot map.
_TRANSIENT = (RedisConnectionError, RedisTimeoutError, MovedError, AskError, ClusterDownError,
              TryAgainError, MasterDownError, SlotNotCoveredError, ReadOnlyError, BusyLoadingError,
              ConnectionError, OSError)


class FleetError(StoreError):
    """The fleet refused to start or an operation on it failed for good."""


class FleetUnavailable(FleetError, UnavailableError):
    """The fleet cannot be reached now: callers fall back to the local store, or
    refuse what only the fleet can answer (a server: 503 with Retry-After)."""

    retry_after_s = PROBE_S


def _transient(err: BaseException) -> bool:
    """Whether a failure is the cluster's (retried), not the command's (reported)."""
    if isinstance(err, _TRANSIENT):
        return True
    if isinstance(err, ResponseError) or isinstance(err, FleetError):
        return False
    # Any other error of the redis client (a half-closed socket surfaces as
    # ValueError "I/O operation on closed file") is a connection's, not ours.
    return isinstance(err, (RedisError, RedisClusterException, ValueError))


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
        self._down_since: float | None = None   # when the cluster was found down (None: it is up)
        self._probed = 0.0                      # when it was last tried while down
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(8, thread_name_prefix="ctx-fleet")
        self._replicas: dict[str, tuple[int, float]] = {}  # master -> (replicas to WAIT for, when asked)
        try:
            self.client()  # connect now: a misconfigured cluster refuses at start, an absent one warns
        except FleetUnavailable:
            pass

    # -- connection ---------------------------------------------------------------------
    def client(self) -> RedisCluster:
        """The cluster client; FleetUnavailable while the cluster is down (tried again
        at most every PROBE_S)."""
        with self._lock:
            if self._rc is not None and self._down_since is None:
                return self._rc
            now = time.monotonic()
            if self._down_since is not None and now - self._probed < PROBE_S:
                raise FleetUnavailable(f"fleet {self.url} is unreachable")
            self._probed = now
            try:
                if self._rc is None:
                    self._rc = self._connect()
                else:
                    self._rc.nodes_manager.initialize()  # the same client, its slot map refreshed
            except (RedisError, RedisClusterException, OSError) as e:
                self._mark_down(e)
                raise FleetUnavailable(f"fleet {self.url} is unreachable") from None
            if self._down_since is not None:
                print(f"ctx: fleet {self.url} is reachable again", file=sys.stderr, flush=True)
                self._down_since = None
            return self._rc

    def _connect(self) -> RedisCluster:
        rc = RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in self.nodes],
                          socket_connect_timeout=CONNECT_TIMEOUT_S, socket_timeout=SOCKET_TIMEOUT_S,
                          require_full_coverage=True)
        try:
            _check_policy(rc, self.url)
        except BaseException:
            rc.close()  # nobody else has seen this client yet
            raise
        return rc

    @property
    def online(self) -> bool:
        try:
            self.client()
        except FleetUnavailable:
            return False
        return True

    def _mark_down(self, err: BaseException | None) -> None:
        """The cluster is down: warn, once until it is back (caller holds the lock)."""
        if self._down_since is not None:
            return
        self._down_since = self._probed = time.monotonic()
        reason = (str(err).splitlines() or [""])[0] or type(err).__name__
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
        Returns {key: reply}. Retries failovers (``_Retry``)."""
        out: dict[str, object] = {}
        todo = list(dict.fromkeys(keys))
        retry = _Retry(self)
        while todo:
            try:
                groups = self._by_master(todo)
            except Exception as e:
                retry.after(e)
                continue
            futures = [self._pool.submit(self._run_group, node, ks, queue, wait) for node, ks in groups]
            failed: list[str] = []
            last: BaseException | None = None
            for (node, ks), fut in zip(groups, futures):
                try:
                    out.update(fut.result())
                except Exception as e:
                    if not _transient(e):
                        raise _reported(e, self.url, node.name) from None
                    failed.extend(ks)
                    last = e
            todo = failed
            if todo:
                retry.after(last)
        return out

    def on_key(self, key: str, queue: Callable, *, wait: bool = False) -> object:
        """One key's command (through ``queue(pipe, key)``) on its master; its reply."""
        return self.grouped([key], queue, wait=wait)[key]

    def scan(self, pattern: str) -> list[str]:
        """Every key matching ``pattern`` on every master (keys as str)."""
        retry = _Retry(self)
        while True:
            try:
                rc = self.client()
                found = []
                for node in rc.get_primaries():
                    conn = rc.get_redis_connection(node)
                    found.extend(_text(k) for k in conn.scan_iter(match=pattern, count=1000))
                return found
            except Exception as e:
                retry.after(e)

    def refresh(self) -> bool:
        """Refresh the slot map; whether any node answered (a failover) or none (down)."""
        try:
            self.client().nodes_manager.initialize()
        except (RedisError, RedisClusterException, OSError) as e:
            cause = e.__cause__ if isinstance(e, RedisClusterException) else e
            return not isinstance(cause, (RedisConnectionError, RedisTimeoutError, OSError))
        return True

    def give_up(self, err: BaseException | None, why: str) -> None:
        with self._lock:
            self._mark_down(err or TimeoutError("no reply"))
        raise FleetUnavailable(f"fleet {self.url} {why}") from None

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
        wanted = self._replicas_of(node) if wait else 0
        if wait:
            pipe.execute_command("WAIT", wanted, WAIT_TIMEOUT_MS)
        replies = pipe.execute(raise_on_error=False)
        if wait and isinstance(replies[-1], int) and replies[-1] < wanted:
            # Not on a replica yet: sent again (idempotent) until one has it, or the deadline.
            raise RedisTimeoutError(f"no replica of {node.name} acknowledged the write")
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return dict(zip(keys, replies))

    def _replicas_of(self, node) -> int:
        """How many replicas a write to ``node`` waits for (at most 1), as the master
        itself says (ROLE): the client's slot map can miss a replica that gossip has
        not announced yet, and a write WAITed for by no one is lost with its master."""
        now = time.monotonic()
        known = self._replicas.get(node.name)
        if known is not None and now - known[1] < REPLICAS_TTL_S:
            return known[0]
        role = self.client().get_redis_connection(node).execute_command("ROLE")
        if _text(role[0]) != "master":
            raise ReadOnlyError(f"{node.name} is no longer a master")  # a failover: retried
        count = min(1, len(role[2]))
        self._replicas[node.name] = (count, now)
        return count

class _Retry:
    """One operation's retries: a failover is waited out (the promoted replica is
    found by refreshing the slot map), an outage is not."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.deadline = time.monotonic() + cluster.deadline_s
        self.silent_since: float | None = None   # since when no node has answered

    def after(self, err: BaseException | None) -> None:
        """Wait for the next attempt; FleetUnavailable if there should be none."""
        if err is not None and not _transient(err):
            raise _reported(err, self.cluster.url, "a node") from None
        self.cluster.retries += 1
        now = time.monotonic()
        if now >= self.deadline:
            self.cluster.give_up(err, f"did not recover within {self.cluster.deadline_s:.0f} s")
        time.sleep(RETRY_PAUSE_S)
        if self.cluster.refresh():
            self.silent_since = None
        elif self.silent_since is None:
            self.silent_since = now
        elif now - self.silent_since >= UNREACHABLE_S:
            self.cluster.give_up(err, f"is unreachable (no node answered for {UNREACHABLE_S:.0f} s)")


def _reported(err: BaseException, url: str, node: str) -> BaseException:
    """A command's own refusal (OOM at maxmemory, a script error) as a one-line FleetError."""
    if isinstance(err, FleetError):
        return err
    first = (str(err).splitlines() or [""])[0] or type(err).__name__
    return FleetError(f"fleet {url}: {node} refused: {first}")


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
