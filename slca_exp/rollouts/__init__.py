"""Sampled rollouts as plain records, and which of a step's rollouts get logged.

``record.py`` builds a :class:`RolloutRecord` from one rollout (both engines call it);
``select.py`` picks a logged step's rollouts (each group's best and worst). Rendering them
(traces, tables, the HTML credit view, the ``rollouts`` command) is ``slca_exp.tracking``'s.
"""

from slca_exp.rollouts.record import (
    Answer,
    Call,
    Rewards,
    RolloutRecord,
    Turn,
    build_record,
    prompt_id,
)
from slca_exp.rollouts.select import due, pick

__all__ = [
    "Answer",
    "Call",
    "Rewards",
    "RolloutRecord",
    "Turn",
    "build_record",
    "due",
    "pick",
    "prompt_id",
]
