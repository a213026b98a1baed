"""Refs that keep evicted contexts' snapshots from gc, and who owns them.

A context table that evicts a context to its store points a ref
``_evicted/<pid>-<start>-<ns>-<table>/<serial>/<context>`` at the snapshot, and drops
it when the context comes back or is deleted. The serial (the context's KV's, never
reused in a process) makes the ref that context's alone: one deleted while its
eviction is written drops its own ref, never that of a new context of its name. A process that dies (kill -9, a crash,
a power cut) cannot drop its refs, and they would pin their pages forever;
``ctx gc`` therefore first drops every such ref whose owner no longer runs.
The owner is its process id *and* that process's start time, so a new
process that happens to get the same id is not mistaken for the dead one,
in its PID namespace (``<ns>``, the namespace's inode number): a process in
another one (a container sharing the store's volume) cannot be looked up in
our /proc, so its refs are never judged here (``ctx gc`` on the host dropped
a running container's refs, and its evicted contexts were lost).
"""
from __future__ import annotations

import os
from pathlib import Path

from ..errors import StoreError

EVICTED_REF_PREFIX = "_evicted"


def _start_time(pid: int) -> int | None:
    """The process's start time (clock ticks after boot, /proc/PID/stat field 22); None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(stat[stat.rindex(")") + 2:].split()[19])  # the name (field 2) may hold spaces and ')'


def _pid_namespace() -> int:
    """The inode number of this process's PID namespace (0 where /proc does not say)."""
    try:
        link = os.readlink("/proc/self/ns/pid")  # "pid:[4026531836]"
    except OSError:
        return 0
    digits = link[link.find("[") + 1:-1]
    return int(digits) if digits.isdigit() else 0


def owner_tag() -> str:
    """This process as a ref component: ``<pid>-<start time>-<PID namespace>``."""
    pid = os.getpid()
    return f"{pid}-{_start_time(pid) or 0}-{_pid_namespace()}"


def owner_alive(component: str) -> bool:
    """Whether the process named by an owner component (``<pid>-<start>-<ns>-<table>``) still runs.

    Refs written before start times were recorded (``<pid>-<table>``) count as
    alive while any process has that id: wrongly dropping a live one's refs
    would lose its evicted contexts, keeping a dead one's only costs space.
    Those of another PID namespace (or of one /proc could not name) count as
    alive: this /proc cannot see their processes.
    """
    parts = component.split("-")
    if not all(p.isdigit() for p in parts) or len(parts) not in (2, 3, 4) or not Path("/proc/self/stat").exists():
        return True  # not ours to judge, or no /proc to judge by
    if len(parts) == 4 and (int(parts[2]) == 0 or int(parts[2]) != _pid_namespace()):
        return True  # another PID namespace's process
    try:
        start = _start_time(int(parts[0]))
    except OSError:
        return True  # /proc hides other users' processes (hidepid): it may well run
    if start is None:
        return False
    return len(parts) == 2 or start == int(parts[1])


def drop_orphaned_refs(store) -> list[str]:
    """Delete the eviction refs of processes that no longer run; the names dropped."""
    dropped = []
    for name in store.refs():
        parts = name.split("/")
        if len(parts) < 3 or parts[0] != EVICTED_REF_PREFIX or owner_alive(parts[1]):
            continue
        try:
            store.delete_ref(name)
        except StoreError:
            continue  # gone meanwhile
        dropped.append(name)
    return dropped
