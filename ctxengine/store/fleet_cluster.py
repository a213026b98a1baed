"""The Redis Cluster under a fleet: connecting, per-node pipelines, retries.

Every fleet operation goes through :class:`Cluster`, which

* groups keys by the master that owns their slot and sends each group as one
  pipeline on that master's own connection, the groups in parallel;
* ends a write group with ``WAIT`` on the same connection: a write is done
  once a replica has it too, so a master killed right after does not lose it;
* retries a group that met a failover (connection refused or reset, a
  timeout, ``MOVED``, ``CLUSTERDOWN``, any other error of the redis client but
  a command's own refusal) after refreshing the slot map; every write we make
  is idempotent (``SET NX``, a compare-and-set that accepts its own value);
* tells a failover from an outage: while some node answers a PING, a master
  that does not is being replaced; when none answers for ``UNREACHABLE_S``,
  the cluster is down. No caller waits past its deadline: a frozen node
  accepts connections and never replies;
* and, when it is down, says so once and fails at once with
  :class:`FleetUnavailable` (docs/fleet.md), while one probe, in the
  background and at most every ``PROBE_S``, tries the cluster again.

Connecting and refreshing the slot map run on one background thread, one at
a time, shared by whoever needs them; no lock is held while anything waits on
the network. One client lives as long as the Cluster.
"""
from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as wait_futures

from redis import Redis
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import (AskError, BusyLoadingError, ClusterDownError, MasterDownError, MovedError,
                              OutOfMemoryError, ReadOnlyError, RedisClusterException, RedisError, ResponseError,
                              SlotNotCoveredError, TryAgainError)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..errors import CorruptDataError, StoreError, UnavailableError

CONNECT_TIMEOUT_S = 1.0     # per node: an address nobody answers on costs this, not a hang
SOCKET_TIMEOUT_S = 5.0      # per reply: a 16 MB pipeline of pages arrives well within it
PING_TIMEOUT_S = 1.0        # a node that does not answer a PING within this is silent
RETRY_DEADLINE_S = 20.0     # a failover (cluster-node-timeout plus election) fits in this
UNREACHABLE_S = 3.0         # no node at all answers this long: the cluster is down, not failing over
PROBE_S = 1.0               # a cluster found down is tried again at most this often
REFUSED_RETRY_S = 5.0       # Retry-After for a refusal that passes without us (OOM until a gc, BUSY)
RETRY_PAUSE_S = 0.1         # between a failed attempt and the next (after a slot map refresh)
REPLICAS_TTL_S = 1.0        # how long a master's count of its replicas is trusted
WAIT_TIMEOUT_MS = 2000      # how long a write waits for its replica's acknowledgement
SAFE_POLICY = "noeviction"  # any other maxmemory-policy may evict pages a ref needs

# What a failover looks like from a client: retried after refreshing the slot map.
_TRANSIENT = (RedisConnectionError, RedisTimeoutError, MovedError, AskError, ClusterDownError,
              TryAgainError, MasterDownError, SlotNotCoveredError, ReadOnlyError, BusyLoadingError,
              ConnectionError, OSError)
_MAY_PASS = ("OOM", "BUSY", "MISCONF", "NOREPLICAS")  # refusals that pass without a change of setup


class FleetError(StoreError):
    """The fleet refused to start (a misconfigured cluster), or an operation on it failed for good."""


class FleetUnavailable(FleetError, UnavailableError):
    """The fleet cannot be reached now: callers work local-only, or refuse (a server: 503)."""

    retry_after_s = PROBE_S


class FleetRefused(FleetError, UnavailableError):
    """The cluster refused a command (OOM at maxmemory, ...): never the caller's fault (a server: 503)."""


class FleetCorrupt(FleetError, CorruptDataError):
    """The fleet holds what ctx never writes there (WRONGTYPE, a ref that is no snapshot id) or
    lacks what it must (a page a manifest names): damage, a server's 500, never the caller's."""


def _transient(err: BaseException) -> bool:
    """Whether a failure is the cluster's (retried), not the command's (reported)."""
    if isinstance(err, _TRANSIENT):
        return True
    if isinstance(err, ResponseError) or isinstance(err, FleetError):
        return False
    # Any other error of the redis client (a half-closed socket: ValueError) is a connection's.
    return isinstance(err, (RedisError, RedisClusterException, ValueError))


class Cluster:
    def __init__(self, url: str, nodes: list[tuple[str, int]], *, deadline_s: float = RETRY_DEADLINE_S):
        self.url = url                   # names the cluster in messages
        self.nodes = nodes               # (host, port) to start from: store/fleet.py's parse_url(url)
        self.deadline_s = deadline_s
        self.retries = 0                 # groups sent again after a failover (for stats and tests)
        self._rc: RedisCluster | None = None
        self._down_since: float | None = None   # when the cluster was found down (None: it is up)
        self._probed = 0.0                      # when it was last tried while down
        self._closed = False
        self._lock = threading.Lock()           # the state above; never held while waiting on the network
        self._pool = ThreadPoolExecutor(8, thread_name_prefix="ctx-fleet")
        self._pingers = ThreadPoolExecutor(16, thread_name_prefix="ctx-fleet-ping")
        self._refresher = ThreadPoolExecutor(1, thread_name_prefix="ctx-fleet-refresh")
        self._refreshing: Future | None = None  # the connect or slot map refresh in flight
        self._replicas: dict[str, tuple[int, float]] = {}  # master -> (replicas to WAIT for, when asked)
        # Connect now: a misconfigured cluster refuses at start (FleetError), an absent one warns.
        try:
            self.refresh().result(timeout=deadline_s)
        except FutureTimeout:
            self._down(RedisTimeoutError(f"no node answered within {deadline_s:.0f} s"))

    # -- connection ---------------------------------------------------------------------
    def client(self) -> RedisCluster:
        """The cluster client; FleetUnavailable at once while the cluster is down (a probe
        is started in the background, at most every PROBE_S, and nobody waits for it)."""
        with self._lock:
            if self._rc is not None and self._down_since is None:
                return self._rc
            probe = not self._closed and time.monotonic() - self._probed >= PROBE_S
            if probe:
                self._probed = time.monotonic()
        if probe:
            self.refresh()
        raise FleetUnavailable(f"fleet {self.url} is unreachable")

    def refresh(self) -> Future:
        """The connect or slot map refresh in flight, or a new one (its result: whether any
        node answered): one at a time, shared by whoever asks."""
        with self._lock:
            if self._refreshing is None or self._refreshing.done():
                self._refreshing = self._refresher.submit(self._refresh)
            return self._refreshing

    def _refresh(self) -> bool:
        """(On the refresher thread.) Connect, or refresh the slot map, if any node answers;
        whether one did. A cluster found down is back once this succeeds; a first
        connection that fails marks it down. FleetError: it answered, misconfigured."""
        if not self._any_answers():
            if self._rc is None:
                self._down(RedisConnectionError("no node answered"))
            return False
        try:
            if self._rc is None:
                rc = self._connect()
                with self._lock:
                    if self._closed:
                        rc.close()
                        return True
                    self._rc = rc
            else:
                self._rc.nodes_manager.initialize()  # the same client, its slot map refreshed
        except (RedisError, RedisClusterException, OSError) as e:
            if self._rc is None:
                self._down(e)
            return True
        with self._lock:
            back, self._down_since = self._down_since is not None, None
        if back:
            print(f"ctx: fleet {self.url} is reachable again", file=sys.stderr, flush=True)
        return True

    def _any_answers(self) -> bool:
        """Whether any node answers a PING now, all asked at once (a frozen node accepts a
        connection and never replies: only a reply counts)."""
        known = [(n.host, n.port) for n in self._rc.get_nodes()] if self._rc is not None else []
        pending = {self._pingers.submit(_ping, host, port) for host, port in dict.fromkeys([*self.nodes, *known])}
        end = time.monotonic() + CONNECT_TIMEOUT_S + 2 * PING_TIMEOUT_S  # connect, handshake, PING
        while pending:
            done, pending = wait_futures(pending, max(0.0, end - time.monotonic()), FIRST_COMPLETED)
            if not done:
                return False
            if any(f.result() for f in done):
                return True
        return False

    def _connect(self) -> RedisCluster:
        try:
            rc = RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in self.nodes],
                              socket_connect_timeout=CONNECT_TIMEOUT_S, socket_timeout=SOCKET_TIMEOUT_S,
                              require_full_coverage=True)
        except RedisClusterException as e:
            if "Cluster mode is not enabled" in str(e):  # a plain Redis answered: it never will as a cluster
                raise FleetError(f"fleet {self.url}: not a Redis Cluster (Cluster mode is not enabled on the node "
                                 f"that answered); a fleet needs cluster-enabled yes (see docs/fleet.md)") from None
            raise
        try:
            _check_policy(rc, self.url)
        except BaseException:
            rc.close()  # nobody else has seen this client yet
            raise
        return rc

    def _down(self, err: BaseException | None) -> None:
        """The cluster is down: warn, once until it is back."""
        with self._lock:
            if self._down_since is not None:
                return
            self._down_since = self._probed = time.monotonic()
        reason = (str(err).splitlines() or [""])[0] or type(err).__name__
        print(f"ctx: warning: fleet {self.url} is unreachable ({reason}); "
              f"working from the local store only", file=sys.stderr, flush=True)

    def close(self) -> None:
        with self._lock:
            self._closed, rc, self._rc = True, self._rc, None
        for pool in (self._pool, self._refresher, self._pingers):
            pool.shutdown(wait=False)
        if rc is not None:
            rc.close()

    # -- grouped pipelines -----------------------------------------------------------------
    def grouped(self, keys: Sequence[str], queue: Callable, *, wait: bool = False,
                keep_errors: bool = False) -> dict[str, object]:
        """Run ``queue(pipe, key)`` (one command per key) for every key, one pipeline per
        master, the masters in parallel; with ``wait``, each pipeline ends with WAIT.
        Returns {key: reply}. Retries failovers (``_Retry``). With ``keep_errors``, a
        command's own refusal (WRONGTYPE) is its key's reply, not an error: for listings,
        where one bad key must not hide the others."""
        out: dict[str, object] = {}
        todo = list(dict.fromkeys(keys))
        retry = _Retry(self)
        while todo:
            try:
                groups = self._by_master(todo)
            except Exception as e:
                retry.after(e)
                continue
            futures = [self._pool.submit(self._run_group, node, ks, queue, wait, keep_errors) for node, ks in groups]
            failed: list[str] = []
            last = None
            for (node, ks), fut in zip(groups, futures):
                try:
                    out.update(retry.result(fut))
                except Exception as e:
                    if not _transient(e):
                        raise _reported(e, self.url, node.name) from None
                    failed.extend(ks)
                    last = e
            todo = failed
            if todo:
                retry.after(last)
        return out

    def on_key(self, key: str, queue: Callable, *, wait: bool = False, keep_errors: bool = False) -> object:
        """One key's command (through ``queue(pipe, key)``) on its master; its reply."""
        return self.grouped([key], queue, wait=wait, keep_errors=keep_errors)[key]

    def scan(self, pattern: str) -> list[str]:
        """Every key matching ``pattern`` on every master (keys as str), the masters in parallel.
        A key that is not ASCII is none of ours (every key ctx writes is): passed over."""
        retry = _Retry(self)
        while True:
            try:
                rc = self.client()
                futures = [self._pool.submit(lambda n: list(rc.get_redis_connection(n).scan_iter(
                    match=pattern, count=1000)), node) for node in rc.get_primaries()]
                return [k.decode() for fut in futures for k in retry.result(fut) if k.isascii()]
            except Exception as e:
                retry.after(e)

    def give_up(self, err: BaseException | None, why: str) -> None:
        self._down(err or RedisTimeoutError("no reply"))
        raise FleetUnavailable(f"fleet {self.url} {why}") from None

    def _by_master(self, keys: list[str]) -> list[tuple[object, list[str]]]:
        rc, groups = self.client(), {}
        for key in keys:
            node = rc.nodes_manager.get_node_from_slot(rc.keyslot(key))
            groups.setdefault(node.name, (node, []))[1].append(key)
        return list(groups.values())

    def _run_group(self, node, keys: list[str], queue: Callable, wait: bool, keep_errors: bool) -> dict[str, object]:
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
        for i, reply in enumerate(replies):
            if not isinstance(reply, Exception):
                continue
            if _transient(reply):
                raise reply
            if not keep_errors or i >= len(keys):  # (WAIT's own reply is never kept)
                raise _reported(reply, self.url, node.name, keys[i] if i < len(keys) else None)
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
    """One operation's retries until its deadline: a failover is waited out, an outage is not."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.deadline = time.monotonic() + cluster.deadline_s
        self.silent_since: float | None = None   # since when no node has answered

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def result(self, fut: Future):
        """A group's reply, waited for no later than the deadline."""
        try:
            return fut.result(timeout=max(0.0, self.left()))
        except FutureTimeout:
            self.cluster.give_up(None, f"did not answer within {self.cluster.deadline_s:.0f} s")

    def after(self, err: BaseException | None) -> None:
        """Wait for the next attempt: until some node answers (the slot map refreshed);
        FleetUnavailable if none does for UNREACHABLE_S, or at the deadline."""
        if err is not None and not _transient(err):
            raise _reported(err, self.cluster.url, "a node") from None
        self.cluster.retries += 1
        while True:
            if self.left() <= 0:
                self.cluster.give_up(err, f"did not recover within {self.cluster.deadline_s:.0f} s")
            time.sleep(min(RETRY_PAUSE_S, self.left()))
            began = time.monotonic()
            if self.answered():
                self.silent_since = None
                return
            self.silent_since = self.silent_since or began
            if time.monotonic() - self.silent_since >= UNREACHABLE_S:
                self.cluster.give_up(err, f"is unreachable (no node answered for {UNREACHABLE_S:.0f} s)")

    def answered(self) -> bool:
        """Whether any node answered (a failover) or none (down), the slot map refreshed if
        one did; waited for until the deadline at most (then: none answered in time)."""
        try:
            return self.cluster.refresh().result(timeout=max(0.0, self.left()))
        except FutureTimeout:
            return False
        except FleetError:
            return True  # it answered, and refused us (misconfigured since): the next attempt says so


def _ping(host: str, port: int) -> bool:
    """Whether the node at host:port answers (any reply: LOADING is an answer)."""
    with Redis(host=host, port=port, socket_connect_timeout=CONNECT_TIMEOUT_S, socket_timeout=PING_TIMEOUT_S) as r:
        try:
            return bool(r.ping())
        except (ResponseError, BusyLoadingError):
            return True
        except (RedisError, OSError):
            return False


def _reported(err: BaseException, url: str, node: str, key: str | None = None) -> BaseException:
    """A command's own refusal as a one-line FleetError: FleetCorrupt for a key ctx did not
    write (WRONGTYPE), else FleetRefused (OOM at maxmemory, a script error). Anything
    but a reply of the cluster is not the fleet's: it goes up as it is."""
    if isinstance(err, FleetError) or not isinstance(err, ResponseError):
        return err
    first = (str(err).splitlines() or [""])[0] or type(err).__name__
    code = "OOM" if isinstance(err, OutOfMemoryError) else getattr(err, "status_code", None) or first.split(" ")[0]
    if code == "WRONGTYPE" or first.startswith("WRONGTYPE"):
        return FleetCorrupt(f"fleet {url}: {'key ' + key if key else 'a key'} on {node} holds another type "
                            f"than ctx writes there ({first}); the fleet's data is damaged")
    refused = FleetRefused(f"fleet {url}: {node} refused: {first if first.startswith(code) else f'{code} {first}'}")
    refused.retry_after_s = REFUSED_RETRY_S if code in _MAY_PASS else None
    return refused


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
