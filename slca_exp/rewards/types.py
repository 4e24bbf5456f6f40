"""Plain data shared by the rewards, the judges and the simulators."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    """One tool call as the policy wrote it.

    Attributes:
        name: the tool's name (whatever the model wrote, allowed or not).
        arguments: the call's arguments (``{}`` when none were given).
        turn: index of the assistant turn holding the call (turns are separated by tool responses).

    """

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    turn: int = 0
