"""What the faces (api/, rpc/) use from the layers below serving, named here
so that they import only serving, text and errors (tests/test_layout.py):
the structures they build or hand on, and the version they report.
"""
from __future__ import annotations

from ..version import __version__
from ..engine.model_source import CatalogEntry
from ..engine.sampler import SamplerParams
from ..engine.scheduler import cancelled_when
from ..ollama.options import NO_EFFECT as OLLAMA_NO_EFFECT, SAMPLER as OLLAMA_SAMPLER
from ..state import Context, Piece
from ..store import Manifest, Store, page_key, validate_name
from ..store.names import is_host_local
from ..store.refs import MIN_PREFIX
from .sessions import Snapshot, client_name

__all__ = ["MIN_PREFIX", "OLLAMA_NO_EFFECT", "OLLAMA_SAMPLER", "CatalogEntry", "Context", "Manifest", "Piece",
           "SamplerParams", "Snapshot", "Store", "__version__", "cancelled_when", "client_name", "is_host_local",
           "page_key", "validate_name"]
