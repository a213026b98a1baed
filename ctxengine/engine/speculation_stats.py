"""What speculation did, counted: kept by the Engine for /metrics and by each
context for its own (engine/speculative.py drafts; state/speculation.py verifies).
A module of its own so that engine.py, which keeps the totals, does not import
the drafters, which use an Engine."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SpeculationStats:
    drafted: int = 0   # tokens proposed and verified
    accepted: int = 0  # of those, tokens the sampler chose too
    steps: int = 0     # verification forwards

    def add(self, drafted: int, accepted: int) -> None:
        self.drafted += drafted
        self.accepted += accepted
        self.steps += 1
