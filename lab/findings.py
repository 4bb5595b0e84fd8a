"""What every fault run reports besides its own counts: the faults injected, the consumers'
outcomes, how long it took and the invariants it found violated."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Findings:
    faults: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def shown(self) -> bool:
        """Print each violation; True when there is none."""
        for violation in self.violations:
            print("VIOLATION", violation)
        return self.ok
