"""Errors a user can act on. The CLI and servers print ``str(err)`` as one line.

Every error raised on purpose by ctxengine derives from :class:`CtxError`;
anything else escaping is a bug.
"""


class CtxError(Exception):
    """Base class of every error ctxengine raises on purpose."""


class ModelFileError(CtxError):
    """A model file is unreadable, truncated or inconsistent."""


class UnsupportedModelError(CtxError):
    """A well-formed model uses an architecture or tensor type we do not run."""


class ModelNotFoundError(CtxError):
    """A model name or path resolves to nothing."""


class WeightsNotServedError(ModelNotFoundError):
    """No model this host serves has a snapshot's weights (so it cannot restore it)."""


class TokenizerError(CtxError):
    """The tokenizer metadata is missing or malformed."""


class ContextError(CtxError):
    """A context operation was refused (unknown name, too long, bad state)."""


class RequestError(CtxError):
    """A request asks for what cannot be done as asked; ``param`` names the
    field at fault, when one is (the faces report it beside the message)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class CancelledError(RequestError):
    """A forward request was given up between two of its steps because its
    caller asked (``engine.scheduler.cancelled_when``); its KV is as it was."""


class InvalidNameError(CtxError):
    """A context, ref or model name is malformed (path tricks, length, characters)."""


class StoreError(CtxError):
    """The snapshot store refused an operation."""


class StorageError(StoreError):
    """The snapshot store's disk failed a write (full, an I/O error): the server's trouble,
    never the request's; nothing of the write was kept."""


class UnavailableError(StoreError):
    """Something only another service can answer (the fleet) cannot be reached now;
    the same request may succeed after ``retry_after_s``."""

    retry_after_s: float = 1.0


class CorruptDataError(StoreError):
    """Stored or transferred bytes failed verification."""


class WeightMismatchError(StoreError):
    """A snapshot was made by other weights than the model it is restored onto."""


class UnsupportedTemplateError(CtxError):
    """A model's Go (Ollama) template uses what we do not render; fall back to the GGUF's template."""


class RefConflictError(StoreError):
    """Another host moved a fleet ref first; this move would have overwritten it."""


class RefDeletedError(RefConflictError):
    """A fleet ref was deleted while a host continued it; this move would have made it again."""
