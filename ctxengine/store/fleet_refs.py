"""Refs, host heartbeats and gc on the fleet (the key layout: store/fleet.py).

A ref moves by compare-and-set in one Lua script on the ref's slot (the ref
and its log share the ``{name}`` hash tag): it moves only if the ref is
absent, already at the new snapshot (a retried move), or at one of the new
snapshot's ancestors (a fast-forward). Two hosts that continued the same
snapshot both name it as their parent; the first to arrive moves the ref, the
second finds it at a snapshot it does not descend from and gets
:class:`RefConflictError`. The move and its log entry are one script, so no
write is lost and the log never disagrees with the ref.

Fleet gc keeps what local gc keeps (store/maintenance.py): snapshots a ref
reaches through parents, their pages, and for ``grace`` seconds whatever is
being published (manifests created that recently, and every page a
publishing marker names).
"""
from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping

from ..errors import RefConflictError
from . import pages as codec
from .fleet_cluster import HOST, MANIFEST, PAGE, PENDING, REF, REFLOG, WEIGHTS, WEIGHTS_LORA, Cluster
from .maintenance import GCResult
from .manifest import Manifest

__all__ = ["RefConflictError", "all_refs", "delete_ref", "gc", "get_ref", "heartbeat", "hosts",
           "hosts_serving", "move_ref", "ref_log"]

# KEYS: ref, log. ARGV: new id, log entry, then the ids the ref may be at.
_MOVE = """
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then return {1, cur} end
if cur then
  local ok = false
  for i = 3, #ARGV do if ARGV[i] == cur then ok = true; break end end
  if not ok then return {0, cur} end
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('RPUSH', KEYS[2], ARGV[2])
return {1, cur or ''}
"""
# KEYS: one hash of hosts by weights. ARGV: host, expiry (unix ms).
_SERVE = """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('PEXPIREAT', KEYS[1], ARGV[2])
return 1
"""


def _ref_keys(name: str) -> tuple[str, str]:
    return f"{REF}{{{name}}}", f"{REFLOG}{{{name}}}"


def get_ref(cluster: Cluster, name: str) -> str | None:
    sid = cluster.on_key(_ref_keys(name)[0], lambda p, k: p.get(k))
    return None if sid is None else sid.decode()


def move_ref(cluster: Cluster, name: str, sid: str, ancestors: list[str], host: str) -> str | None:
    """Compare-and-set ``name`` to ``sid`` (acknowledged by a replica); the old id."""
    ref, log = _ref_keys(name)
    entry = json.dumps({"time": time.time(), "new": sid, "host": host}, sort_keys=True)
    ok, cur = cluster.on_key(ref, lambda p, k: p.eval(_MOVE, 2, ref, log, sid, entry, *ancestors), wait=True)
    cur = cur.decode() if cur else None
    if not ok:
        mover = _last_mover(cluster, name)
        raise RefConflictError(
            f"ref '{name}' was moved on the fleet to {cur[:16]}{mover} meanwhile; snapshot {sid[:16]} "
            f"does not descend from it, so the ref was left there (the snapshot is stored; restore "
            f"'{name}' to continue from the fleet's)")
    return cur


def _last_mover(cluster: Cluster, name: str) -> str:
    entries = ref_log(cluster, name)
    host = entries[-1].get("host") if entries else None
    return f" by host {host}" if host else ""


def delete_ref(cluster: Cluster, name: str) -> bool:
    ref, log = _ref_keys(name)
    return bool(cluster.on_key(ref, lambda p, k: p.delete(ref, log), wait=True))


def ref_log(cluster: Cluster, name: str) -> list[dict]:
    """Every move of ``name`` on the fleet, oldest first: {time, new, host}."""
    log = _ref_keys(name)[1]
    return [json.loads(e) for e in cluster.on_key(log, lambda p, k: p.lrange(k, 0, -1))]


def all_refs(cluster: Cluster) -> dict[str, str]:
    keys = cluster.scan(REF + "*")
    values = cluster.grouped(keys, lambda p, k: p.get(k))
    return {k[len(REF) + 1:-1]: v.decode() for k, v in values.items() if v is not None}


# -- hosts ----------------------------------------------------------------------------------
def heartbeat(cluster: Cluster, host: str, info: dict, served: Mapping[str, Iterable[str]], ttl: float) -> None:
    """Say this host is alive for ``ttl`` seconds, with what it serves and holds;
    ``served``: weight id -> the ids of the LoRA adapters it runs with those weights."""
    expiry_ms = int((time.time() + ttl) * 1000)
    body = json.dumps({**info, "host": host, "seen": time.time()}, sort_keys=True)
    cluster.on_key(HOST + host, lambda p, k: p.set(k, body, px=int(ttl * 1000)))
    keys = [key for wid, adapters in served.items() for key in _serving_keys(wid, adapters)]
    if keys:
        cluster.grouped(keys, lambda p, k: p.eval(_SERVE, 1, k, host, expiry_ms))


def _serving_keys(weight_id: str, adapters: Iterable[str]) -> list[str]:
    """The hashes a host serving these weights with these adapters is listed in."""
    return [WEIGHTS + weight_id, *(f"{WEIGHTS_LORA}{weight_id}:{a}" for a in dict.fromkeys(adapters))]


def hosts(cluster: Cluster) -> list[dict]:
    """Every host whose heartbeat has not expired, by name."""
    keys = cluster.scan(HOST + "*")
    bodies = cluster.grouped(keys, lambda p, k: p.get(k))
    return sorted((json.loads(b) for b in bodies.values() if b is not None), key=lambda h: h["host"])


def hosts_serving(cluster: Cluster, weight_id: str, adapters: Iterable[str] = ()) -> list[str]:
    """Hosts whose heartbeat says they serve these weights with (at least) these LoRA
    adapters, so they can restore what they made (expired ones left out)."""
    now_ms = time.time() * 1000
    keys = _serving_keys(weight_id, adapters)
    found = cluster.grouped(keys, lambda p, k: p.hgetall(k))
    live = [{h.decode() for h, until in found[k].items() if int(until) > now_ms} for k in keys]
    return sorted(set.intersection(*live))


# -- gc ---------------------------------------------------------------------------------------
def _manifests(cluster: Cluster, prefix: str, sids: Iterable[str]) -> dict[str, Manifest]:
    sids = list(sids)
    records = cluster.grouped([prefix + s for s in sids], lambda p, k: p.get(k))
    out = {}
    for sid in sids:
        record = records[prefix + sid]
        if record is not None:
            data = codec.decode(sid, bytes(record), what="snapshot")
            out[sid] = Manifest.from_bytes(data, what=f"snapshot {sid} (fleet)")
    return out


def gc(cluster: Cluster, grace: float) -> GCResult:
    """Remove fleet snapshots no ref reaches and pages no kept snapshot names.

    Not one transaction (Redis Cluster has none across slots): what a publish
    in flight needs is protected by its marker and by the grace period, and
    markers are read again just before pages are deleted.
    """
    cutoff = time.time() - grace
    live: dict[str, Manifest] = {}
    wave = set(all_refs(cluster).values())
    while wave:  # refs, then parent chains, one pipelined read per generation
        found = _manifests(cluster, MANIFEST, wave)
        live.update(found)
        wave = {m.parent for m in found.values() if m.parent and m.parent not in live}
    stored = [k[len(MANIFEST):] for k in cluster.scan(MANIFEST + "*")]
    young = {s: m for s, m in _manifests(cluster, MANIFEST, [s for s in stored if s not in live]).items()
             if m.created >= cutoff}
    live.update(young)
    dead_manifests = [s for s in stored if s not in live]
    live_pages = {k for m in live.values() for k in m.page_keys}

    pages = [k[len(PAGE):] for k in cluster.scan(PAGE + "*")]
    publishing = _manifests(cluster, PENDING, [k[len(PENDING):] for k in cluster.scan(PENDING + "*")])
    live_pages.update(k for m in publishing.values() for k in m.page_keys)
    dead_pages = [k for k in pages if k not in live_pages]
    sizes = cluster.grouped([PAGE + k for k in dead_pages], lambda p, k: p.strlen(k))
    if dead_pages:
        cluster.grouped([PAGE + k for k in dead_pages], lambda p, k: p.unlink(k), wait=True)
    if dead_manifests:
        cluster.grouped([MANIFEST + s for s in dead_manifests], lambda p, k: p.unlink(k), wait=True)
    return GCResult(len(dead_manifests), len(dead_pages), sum(int(v) for v in sizes.values()),
                    len(stored) - len(dead_manifests), len(pages) - len(dead_pages))
