"""Live contexts: named, forked copy-on-write, rewound, snapshotted."""
from .context import Context
from .piece import Piece
from .residency import Residency
from .table import ContextTable

__all__ = ["Context", "ContextTable", "Piece", "Residency"]
