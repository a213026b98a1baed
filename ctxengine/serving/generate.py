"""What a face states about a generation, in terms the layers below take.

:class:`Sampling` is a request's sampling settings whatever dialect it came
in (api/options.py reads each dialect's field names into one), checked as
the sampler will check them.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..engine.sampler import SamplerParams
from ..errors import CtxError

__all__ = ["Sampling"]


@dataclass
class Sampling:
    max_tokens: int | None = None                  # None: up to the context length
    stop: list[str] | None = None
    params: dict = field(default_factory=dict)     # SamplerParams fields
    num_ctx: int | None = None                     # Ollama: a smaller context length
    speculative: bool | None = None                # False: no drafts (state/speculation.py); None: on

    def over(self, base: "Sampling") -> "Sampling":
        """These settings where set, else ``base``'s."""
        return Sampling(max_tokens=self.max_tokens if self.max_tokens is not None else base.max_tokens,
                        stop=self.stop if self.stop is not None else base.stop,
                        params={**base.params, **self.params},
                        num_ctx=self.num_ctx if self.num_ctx is not None else base.num_ctx,
                        speculative=self.speculative if self.speculative is not None else base.speculative)

    def checked(self) -> "Sampling":
        """Refuse values the sampler would refuse, before any work is done (a CtxError: a 400)."""
        SamplerParams(**self.params)
        if self.stop is not None and any(not s for s in self.stop):
            raise CtxError("stop strings must not be empty")
        return replace(self, stop=list(self.stop or []))
