"""Recursive Self-Rewrite (paper §2.1 Eq. 2–3, Appendix D): discovery under complementary
harnesses, runbook planning, review, fresh execution with private guidance, leak screening,
and actor-only fine-tuning on Q_clean (see docs/rsr.md).

Modules: `runbook` (Runbook, parse, digest), `guidance` (execution_harness, public_view),
`discovery`, `planner`, `reviewer` (gate and leak screen), `stage` (the `rsr` experiment),
`base_sft` (the `base_sft` experiment). Heavy parts are imported where used.
"""

from terminal_rsi.rsr.guidance import execution_harness, public_view
from terminal_rsi.rsr.runbook import Runbook, RunbookError, digest_runbook

__all__ = ["Runbook", "RunbookError", "digest_runbook", "execution_harness", "public_view"]
