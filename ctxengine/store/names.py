"""Validation of user-chosen names (refs here; context names elsewhere).

A name may end up as a path component, a URL segment, an LMDB key prefix or a
line in a log, so we accept a deliberately small alphabet and reject anything
that could be read as a path trick (``..``, a leading ``/``) or that would not
print cleanly (control characters).

Rule: 1..128 characters from ``[A-Za-z0-9._-]`` plus ``/`` used only as a
separator between non-empty components; no component is ``.`` or ``..``.

A name starting with ``_`` is **host-local**: a serving process's own (its
prefix cache, evicted contexts, stored responses), never a client's, and
never published to a fleet. This is the one place that rule is written.
"""
from __future__ import annotations

import os
import re
import socket

from ..errors import InvalidNameError

MAX_NAME_LEN = 128
HOST_LOCAL_PREFIX = "_"

_COMPONENT = re.compile(r"[A-Za-z0-9._-]+")


def validate_name(name: object, what: str = "ref") -> str:
    """Return ``name`` unchanged if it is a valid name, else raise InvalidNameError.

    ``what`` ("ref", "context", ...) is only used to word the message.
    """
    if not isinstance(name, str):
        raise InvalidNameError(f"{what} name must be a string, not {type(name).__name__}")
    if not name:
        raise InvalidNameError(f"{what} name is empty")
    if len(name) > MAX_NAME_LEN:
        raise InvalidNameError(
            f"{what} name is {len(name)} characters long; the limit is {MAX_NAME_LEN}"
        )
    bad = [c for c in name if ord(c) < 0x20 or ord(c) == 0x7F]
    if bad:
        raise InvalidNameError(
            f"{what} name {name!r} contains a control character ({bad[0]!r})"
        )
    if name.startswith("/"):
        raise InvalidNameError(f"{what} name {name!r} must not start with '/'")
    for component in name.split("/"):
        if not component:
            raise InvalidNameError(
                f"{what} name {name!r} has an empty component ('//' or a trailing '/')"
            )
        if component in (".", ".."):
            raise InvalidNameError(
                f"{what} name {name!r} must not contain a '.' or '..' component"
            )
        if not _COMPONENT.fullmatch(component):
            odd = next(c for c in component if not _COMPONENT.fullmatch(c))
            raise InvalidNameError(
                f"{what} name {name!r} contains {odd!r}; "
                "allowed: letters, digits, '.', '_', '-' and '/' between components"
            )
    return name


def is_host_local(name: str) -> bool:
    """Whether a ref or context name is a host's own (see the module doc)."""
    return name.startswith(HOST_LOCAL_PREFIX)


def validate_client_name(name: object, what: str = "context") -> str:
    """validate_name, and not host-local: a name a client may create or move.

    A client's context under a server's name would be taken for the server's:
    hidden from listings, and an ``_evicted/...`` one dropped by ``ctx gc``.
    """
    validate_name(name, what)
    if is_host_local(name):
        raise InvalidNameError(f"{what} names starting with '{HOST_LOCAL_PREFIX}' are reserved for the server: "
                               f"{name!r}")
    return name


# A host id goes into every HTTP response (X-Ctx-Host), fleet keys and log lines:
# printable ASCII without spaces is all a header value, a key and a line take as is.
MAX_HOST_ID_LEN = 128
_HOST_ID = re.compile(r"[!-~]{1,%d}" % MAX_HOST_ID_LEN)


def is_host_id(host_id: object) -> bool:
    return isinstance(host_id, str) and _HOST_ID.fullmatch(host_id) is not None


def validate_host_id(host_id: object, what: str = "host id") -> str:
    """Return ``host_id`` if it is 1..MAX_HOST_ID_LEN printable ASCII characters, no
    spaces; else InvalidNameError, one line, the value quoted short."""
    if not is_host_id(host_id):
        shown = repr(host_id) if len(repr(host_id)) <= 80 else repr(host_id)[:76] + "..."
        raise InvalidNameError(f"{what} {shown} is not valid: a host id is 1 to {MAX_HOST_ID_LEN} printable ASCII "
                               "characters, no spaces or control characters")
    return host_id


def default_host_id() -> str:
    """This process's name among a fleet's hosts: $CTX_HOST_ID, else hostname:pid
    (InvalidNameError if that is not a valid host id)."""
    chosen = os.environ.get("CTX_HOST_ID")
    if chosen:
        return validate_host_id(chosen, "CTX_HOST_ID")
    return validate_host_id(f"{socket.gethostname()}:{os.getpid()}", "the default host id (hostname:pid; set CTX_HOST_ID)")
