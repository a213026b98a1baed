"""Where ctxengine keeps its files.

``CTX_HOME`` puts everything under one directory (tests, portable installs):
``$CTX_HOME`` holds the data (models), ``$CTX_HOME/cache`` the caches.
Otherwise the XDG base directories are used:
``$XDG_DATA_HOME/ctxengine`` (default ``~/.local/share/ctxengine``) and
``$XDG_CACHE_HOME/ctxengine`` (default ``~/.cache/ctxengine``).

These functions only compute paths; whoever writes there creates the directory.
"""
from __future__ import annotations

import os
from pathlib import Path

APP = "ctxengine"


def _ctx_home() -> Path | None:
    home = os.environ.get("CTX_HOME")
    return Path(home).expanduser() if home else None


def _xdg(variable: str, fallback: str) -> Path:
    # The XDG spec says a relative value is invalid and must be ignored.
    value = os.environ.get(variable, "")
    if value and os.path.isabs(value):
        return Path(value)
    return Path.home() / fallback


def data_dir() -> Path:
    """Persistent files: pulled and assembled models."""
    return _ctx_home() or _xdg("XDG_DATA_HOME", ".local/share") / APP


def cache_dir() -> Path:
    """Files that can be rebuilt at any time (the weight-id cache)."""
    home = _ctx_home()
    return home / "cache" if home else _xdg("XDG_CACHE_HOME", ".cache") / APP


def models_dir() -> Path:
    """Model files fetched by ``ctx pull`` or assembled from packages."""
    return data_dir() / "models"
