"""Refs, host heartbeats and gc on the fleet (the key layout: store/fleet.py).

A ref moves by compare-and-set in one Lua script on the ref's slot (the ref
and its log share the ``{name}`` hash tag): it moves only if the ref is
absent, already at the new snapshot (a retried move), or at one of the new
snapshot's ancestors (a fast-forward). Two hosts that continued the same
snapshot both name it as their parent; the first to arrive moves the ref, the
second finds it at a snapshot it does not descend from and gets
:class:`RefConflictError`. The move and its log entry are one script, so no
write is lost and the log never disagrees with the ref.

Deleting a ref leaves a tombstone in its slot (``ctx:rx:{name}``: when and by
which host; kept TOMBSTONE_S): a host still holding a live
copy of the context finds the ref gone *and* the tombstone, and drops its copy
rather than take the absent ref for one never published (which its next turn
would publish again: the deleted conversation back). A new context made under
the name, or any move of the ref, clears it.

Fleet gc keeps what local gc keeps (store/maintenance.py): snapshots a ref
reaches through parents, their pages, and for ``grace`` seconds whatever is
being published (manifests created that recently, and every page a
publishing marker names).
"""
from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Mapping

from ..errors import RefConflictError, RefDeletedError
from . import pages as codec
from .fleet_cluster import Cluster, FleetCorrupt, FleetError
from .maintenance import GCResult
from .manifest import Manifest
from .names import is_host_id

__all__ = ["RefConflictError", "RefDeletedError", "all_refs", "delete_ref", "deleted", "forget_deleted", "gc", "get_ref", "heartbeat",
           "hosts", "hosts_serving", "move_ref", "ref_log"]

# Key layout (store/fleet.py's docstring): pages, manifests, publishing markers,
# refs and their logs (hash-tagged by name), host heartbeats, hosts by weights
# and by (weights, LoRA adapter).
PAGE, MANIFEST, PENDING = "ctx:p:", "ctx:m:", "ctx:pm:"
REF, REFLOG, HOST, WEIGHTS, WEIGHTS_LORA = "ctx:r:", "ctx:rl:", "ctx:host:", "ctx:w:", "ctx:wl:"
TOMBSTONE = "ctx:rx:"
TOMBSTONE_S = 30 * 24 * 3600  # how long a deleted ref's tombstone is kept: past any live copy's idle life

_SNAPSHOT_ID = re.compile(rb"[0-9a-f]{%d}" % codec.KEY_HEX_LEN)
QUOTED_BYTES = 64   # of a garbage value an error quotes (a ref may hold megabytes of anything)

# KEYS: ref, log, tombstone. ARGV: new id, log entry, then the ids the ref may be at.
# Where the ref is absent but its tombstone says it was deleted at one of those ids,
# the move continues the deleted context (a turn that ran through the delete): refused,
# {2, that id}. A tombstone of another history (or of the older, string, form) does not
# stop a move, which clears it.
_MOVE = """
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then return {1, cur} end
if cur then
  local ok = false
  for i = 3, #ARGV do if ARGV[i] == cur then ok = true; break end end
  if not ok then return {0, cur} end
elseif redis.call('TYPE', KEYS[3]).ok == 'hash' then
  local at = redis.call('HGET', KEYS[3], 'at')
  for i = 3, #ARGV do if ARGV[i] == at then return {2, at} end end
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('RPUSH', KEYS[2], ARGV[2])
redis.call('DEL', KEYS[3])
return {1, cur or ''}
"""
# KEYS: ref, log, tombstone. ARGV: the tombstone's entry, its life (s). The tombstone
# keeps the id the ref was at: a move continuing it is refused (_MOVE).
_DELETE = """
local cur = redis.call('GET', KEYS[1])
if not cur then return 0 end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
redis.call('HSET', KEYS[3], 'entry', ARGV[1], 'at', cur)
redis.call('EXPIRE', KEYS[3], ARGV[2])
return 1
"""
# KEYS: one hash of hosts by weights. ARGV: host, expiry (unix ms).
_SERVE = """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('PEXPIREAT', KEYS[1], ARGV[2])
return 1
"""


def _ref_keys(name: str) -> tuple[str, str]:
    return f"{REF}{{{name}}}", f"{REFLOG}{{{name}}}"


def _tombstone_key(name: str) -> str:
    return f"{TOMBSTONE}{{{name}}}"


def get_ref(cluster: Cluster, name: str) -> str | None:
    """The snapshot id ref ``name`` is at (None: no such ref); FleetCorrupt if the ref holds
    anything else (ctx only ever writes an id there)."""
    value = cluster.on_key(_ref_keys(name)[0], lambda p, k: p.get(k))
    if value is None or _SNAPSHOT_ID.fullmatch(value):
        return None if value is None else value.decode()
    raise _damaged_ref(name, value)


def _damaged_ref(name: str, value: bytes) -> FleetCorrupt:
    return FleetCorrupt(f"fleet ref '{name}' holds {_quoted(value)}, not a snapshot id; the fleet's data is "
                        f"damaged (delete the ref on the fleet)")


def _quoted(value: bytes) -> str:
    """A value read from the fleet as an error may quote it: its first QUOTED_BYTES, so a
    megabyte of garbage is never echoed whole into a reply."""
    if len(value) <= QUOTED_BYTES:
        return repr(bytes(value))
    return f"{bytes(value[:QUOTED_BYTES])!r}... ({len(value)} bytes)"


def move_ref(cluster: Cluster, name: str, sid: str, ancestors: list[str], host: str) -> str | None:
    """Compare-and-set ``name`` to ``sid`` (acknowledged by a replica); the old id."""
    ref, log = _ref_keys(name)
    entry = json.dumps({"time": time.time(), "new": sid, "host": host}, sort_keys=True)
    ok, cur = cluster.on_key(ref, lambda p, k: p.eval(_MOVE, 3, ref, log, _tombstone_key(name), sid, entry,
                                                      *ancestors), wait=True)
    if cur and not _SNAPSHOT_ID.fullmatch(cur):
        raise _damaged_ref(name, cur)  # (never one of the ids the move accepts)
    cur = cur.decode() if cur else None
    if ok == 2:
        raise RefDeletedError(
            f"ref '{name}' was deleted on the fleet{_deleter(cluster, name)} while snapshot {sid[:16]} "
            f"continued it; the ref was not made again (the snapshot is stored)")
    if not ok:
        mover = _last_mover(cluster, name)
        raise RefConflictError(
            f"ref '{name}' was moved on the fleet to {cur[:16]}{mover} meanwhile; snapshot {sid[:16]} "
            f"does not descend from it, so the ref was left there (the snapshot is stored; restore "
            f"'{name}' to continue from the fleet's)")
    return cur


def _deleter(cluster: Cluster, name: str) -> str:
    """' by host <h>' naming who deleted ``name``, or '' when the tombstone cannot say."""
    try:
        entry = _json_object(cluster.on_key(_tombstone_key(name), lambda p, k: p.hget(k, "entry"),
                                            keep_errors=True))
    except FleetError:
        return ""
    host = entry.get("host") if entry is not None else None
    return f" by host {host}" if is_host_id(host) else ""


def _last_mover(cluster: Cluster, name: str) -> str:
    """' by host <h>' naming who moved ``name`` last, or '' when the log cannot say: the
    conflict is the news, so neither a damaged log nor the fleet going away replaces it."""
    try:
        last = _json_object(cluster.on_key(_ref_keys(name)[1], lambda p, k: p.lindex(k, -1), keep_errors=True))
    except FleetError:
        return ""
    host = last.get("host") if last is not None else None
    return f" by host {host}" if is_host_id(host) else ""


def delete_ref(cluster: Cluster, name: str, host: str) -> bool:
    """Delete ref ``name`` and its log, leaving its tombstone; False if there was no ref."""
    ref, log = _ref_keys(name)
    entry = json.dumps({"time": time.time(), "host": host}, sort_keys=True)
    return bool(cluster.on_key(ref, lambda p, k: p.eval(_DELETE, 3, ref, log, _tombstone_key(name), entry,
                                                        TOMBSTONE_S), wait=True))


def deleted(cluster: Cluster, name: str) -> bool:
    """Whether ref ``name`` was deleted (its tombstone is there) and not made again since."""
    return bool(cluster.on_key(_tombstone_key(name), lambda p, k: p.exists(k)))


def forget_deleted(cluster: Cluster, name: str) -> None:
    """Clear ref ``name``'s tombstone: a new context of that name is being made."""
    cluster.on_key(_tombstone_key(name), lambda p, k: p.delete(k))


def ref_log(cluster: Cluster, name: str) -> list[dict]:
    """Every move of ``name`` on the fleet, oldest first: {time, new, host} (an entry
    ctx did not write is left out)."""
    log = _ref_keys(name)[1]
    entries = (_json_object(e) for e in cluster.on_key(log, lambda p, k: p.lrange(k, 0, -1)))
    return [e for e in entries if e is not None]


def _json_object(entry) -> dict | None:
    """A ref log entry or a heartbeat as ctx writes it, a JSON object; else None."""
    try:
        found = json.loads(entry) if isinstance(entry, bytes) else None
    except ValueError:  # not JSON, or not UTF-8
        return None
    return found if isinstance(found, dict) else None


def all_refs(cluster: Cluster) -> dict[str, str]:
    """Every ref on the fleet and its snapshot id; a ref holding anything else (it reaches
    nothing) is left out, so one damaged ref neither hides the others nor stops gc."""
    keys = cluster.scan(REF + "*")
    values = cluster.grouped(keys, lambda p, k: p.get(k), keep_errors=True)
    return {k[len(REF) + 1:-1]: v.decode() for k, v in values.items()
            if isinstance(v, bytes) and _SNAPSHOT_ID.fullmatch(v)}


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


def hosts(cluster: Cluster) -> tuple[list[dict], list[str]]:
    """Every host whose heartbeat has not expired, by name, and the keys under ``ctx:host:``
    that hold no heartbeat (not ctx's: left out, for the listing is advisory and one bad
    record must not hide the live hosts)."""
    keys = cluster.scan(HOST + "*")
    bodies = cluster.grouped(keys, lambda p, k: p.get(k), keep_errors=True)
    beats, bad = [], []
    for key, body in bodies.items():
        beat = _json_object(body)
        if beat is not None and isinstance(beat.get("host"), str):
            beats.append(beat)
        elif body is not None:  # (None: it expired between the scan and the read)
            bad.append(key)
    return sorted(beats, key=lambda h: h["host"]), sorted(bad)


def hosts_serving(cluster: Cluster, weight_id: str, adapters: Iterable[str] = ()) -> list[str]:
    """Hosts whose heartbeat says they serve these weights with (at least) these LoRA
    adapters, so they can restore what they made (expired ones left out)."""
    now_ms = time.time() * 1000
    keys = _serving_keys(weight_id, adapters)
    found = cluster.grouped(keys, lambda p, k: p.hgetall(k), keep_errors=True)
    return sorted(set.intersection(*(_serving(found[k], now_ms) for k in keys)))


def _serving(entries, now_ms: float) -> set[str]:
    """The hosts of one serving hash (host -> until when, unix ms) still serving; an entry
    or a key ctx did not write (not a number, not a hash) names no one."""
    live = set()
    for host, until in entries.items() if isinstance(entries, dict) else ():
        try:
            if int(until) > now_ms:
                live.add(host.decode())
        except ValueError:  # not a number; or a host name that is not UTF-8
            continue
    return live


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
