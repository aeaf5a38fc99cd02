"""Moved: every rule now lives in `planner.rules` (the one rulebook). Kept so old imports still work."""

from planner.rules import Reason, Violation, memory_advice, memory_violations, structural_violations

__all__ = ["Reason", "Violation", "memory_advice", "memory_violations", "structural_violations"]
