"""One logged rollout as terminal text: header, rewards, segment advantages, then the turns.

Colour (ANSI) only through a :class:`Palette` that is on; text a model wrote is printed with its
control characters escaped, so that a rollout cannot drive the terminal.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from typing import Any

from slca_exp.core.names import TOOL_COMPONENTS
from slca_exp.rollouts.pairing import REWARDS, Pair, question
from slca_exp.rollouts.record import Call, RolloutRecord, Turn

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


@dataclass(frozen=True)
class Palette:
    """ANSI styles, or none (``Palette(False)``): every method returns its text styled."""

    on: bool

    @classmethod
    def for_stream(cls, stream: Any) -> Palette:  # noqa: ANN401 - a text stream
        """Colour when ``stream`` is a terminal and ``NO_COLOR`` is unset or empty."""
        tty = bool(getattr(stream, "isatty", lambda: False)())
        return cls(tty and not os.environ.get("NO_COLOR"))

    def _style(self, code: str, text: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.on else text

    def bold(self, text: str) -> str:
        """Bold."""
        return self._style("1", text)

    def dim(self, text: str) -> str:
        """Faint: what the update does not train on."""
        return self._style("2", text)

    def segment(self, segment: str, text: str) -> str:
        """The segment's colour: tool cyan, summary magenta, env faint."""
        codes = {"tool": "36", "summary": "35", "env": "2"}
        return self._style(codes.get(segment, "33"), text)

    def signed(self, value: float | None, text: str) -> str:
        """Green for a positive advantage, red for a negative one."""
        if value is None or value == 0:
            return text
        return self._style("32" if value > 0 else "31", text)


def render(record: RolloutRecord, palette: Palette) -> str:
    """One rollout as text: header, rewards, advantages, then the response turn by turn."""
    lines = [
        palette.bold(_header(record)),
        *_reward_lines(record),
        _advantage_line(record, palette),
        *_drift_lines(record),
        *_prompt_lines(record),
        *_response_lines(record, palette),
    ]
    return "\n".join(lines)


def render_pair(pair: Pair, palette: Palette) -> str:
    """One prompt in two runs: per run its calls, summary and rewards, then ``B - A``."""
    lines = [palette.bold(f"━━ {pair.key} · {_printable(question(pair.a))} ━━")]
    for side, record in (("A", pair.a), ("B", pair.b)):
        rewards = record.rewards
        rating = "—" if rewards.rating is None else f"{rewards.rating}/5"
        lines.append(
            f"{side}  tool {_num(rewards.tool)}  summary {_num(rewards.summary)} (rating "
            f"{rating}, judge {rewards.judge_status})  total {_num(rewards.total)}"
        )
        calls = ", ".join(
            f"{_printable(c.name)}({_printable(json.dumps(c.arguments, ensure_ascii=False))})"
            for c in record.calls
        )
        lines.append(f"   calls: {calls or '(none)'}")
        summary = record.summary_text or (
            "(cut off: no summary)" if record.ends_on_tool_call else ""
        )
        lines.append(palette.segment("summary", f"   summary: {_printable(summary)}"))
    deltas = [(name, pair.delta(name)) for name in REWARDS]
    shown = "  ".join(f"{name} {palette.signed(d, _num(d, '+.3f'))}" for name, d in deltas)
    lines.append(f"B - A  {shown}")
    return "\n".join(lines)


def _header(record: RolloutRecord) -> str:
    rank = record.rank or "unranked"
    return (
        f"━━ step {record.step} · {record.split} · group {record.group} · sample "
        f"{record.sample} · {rank} ━━"
    )


def _reward_lines(record: RolloutRecord) -> list[str]:
    rewards = record.rewards
    parts = " ".join(f"{k} {_num(rewards.components.get(k))}" for k in TOOL_COMPONENTS)
    extra = [k for k in rewards.components if k not in TOOL_COMPONENTS]
    parts += "".join(f" {k} {_num(rewards.components[k])}" for k in extra)
    rating = "—" if rewards.rating is None else f"{rewards.rating}/5"
    judge = f"judge {rewards.judge_status}"
    if rewards.judge_reason:
        judge += f": {_printable(rewards.judge_reason)}"
    no_call = " (gold makes no call)" if rewards.should_no_call else ""
    return [
        f"reward  tool {_num(rewards.tool)} ({parts}){no_call}",
        f"        summary {_num(rewards.summary)} (rating {rating}, {judge})",
        f"        total {_num(rewards.total)} (routed: tool {_num(rewards.routed_tool)}, "
        f"summary {_num(rewards.routed_summary)})",
    ]


def _drift_lines(record: RolloutRecord) -> list[str]:
    """A line where the ids drift from the chat template's rendering (none where they agree)."""
    drift = record.drift
    if drift is None or not drift.mismatched:
        return []
    return [
        f"drift   {drift.mismatched} of {drift.tokens} tokens differ from the chat template's "
        f"rendering; first at token {drift.first} ({drift.where}): template "
        f"{_printable(repr(drift.expected))}, rollout {_printable(repr(drift.found))}"
    ]


def _advantage_line(record: RolloutRecord, palette: Palette) -> str:
    counts = {seg: record.segment_tokens(seg) for seg in ("tool", "summary", "env", "none")}
    if record.split == "val":
        adv = "A: — (validation: no update, no advantages)"
    else:
        tool, summary = record.tool_adv, record.summary_adv
        adv = (
            f"A: tool {palette.signed(tool, _num(tool, '+.3f'))}, "
            f"summary {palette.signed(summary, _num(summary, '+.3f'))}"
        )
    tokens = (
        f"tokens: tool {counts['tool']}, summary {counts['summary']}, env {counts['env']} "
        "(not trained)"
    )
    if counts["none"]:
        tokens += f", outside both segments {counts['none']}"
    return f"{adv} | {tokens}"


def _prompt_lines(record: RolloutRecord) -> list[str]:
    asked = [m for m in record.prompt if m.get("role") == "user"]
    return [f"prompt  {_printable(question(record))}"] if asked else []


def _response_lines(record: RolloutRecord, palette: Palette) -> list[str]:
    lines: list[str] = []
    assistant = -1
    for turn in record.turns:
        lines.append(palette.segment(turn.segment, _marker(record, turn)))
        text = _printable(turn.text, keep_newlines=True)
        lines.append(palette.dim(text) if turn.role == "tool" else text)
        if turn.role == "assistant":
            assistant += 1
            lines += [_call_line(c) for c in record.calls if c.turn == assistant]
    if record.ends_on_tool_call:
        lines.append(palette.dim("(cut off: the last call was never answered; no summary)"))
    return lines


def _marker(record: RolloutRecord, turn: Turn) -> str:
    """``── tool segment (12 tokens, A=+0.800) ──`` above a turn."""
    if turn.role == "tool":
        return "── tool response (env, not trained) ──"
    if record.split == "val":
        adv = "A=— (validation)"
    elif turn.segment in ("tool", "summary"):
        adv = f"A={_num(record.tool_adv if turn.segment == 'tool' else record.summary_adv, '+.3f')}"
    else:
        adv = "in neither segment"
    name = f"{turn.segment} segment" if turn.segment in ("tool", "summary") else "assistant turn"
    return f"── {name} ({turn.tokens} tokens, {adv}) ──"


def _call_line(call: Call) -> str:
    arguments = json.dumps(call.arguments, ensure_ascii=False)
    head = f"  ↳ call {_printable(call.name)}({_printable(arguments)})"
    answer = call.answer
    if answer is None:
        return f"{head}\n    no answer (nothing followed the call)"
    how = [answer.status or "status unknown"]
    if answer.reason:
        how.append(_printable(answer.reason))
    if answer.cached is not None:
        how.append("cached" if answer.cached else "not cached")
    return f"{head}\n    answer ({', '.join(how)}): {_printable(answer.content)}"


def signed_number(value: float | None) -> str:
    """``+0.125`` / ``-0.050``; ``—`` for a missing value."""
    return _num(value, "+.3f")


def _num(value: float | None, spec: str = ".3f") -> str:
    """``0.750`` (``+0.800`` with ``spec="+.3f"``); ``—`` for a missing or not-a-number value."""
    if value is None or math.isnan(value):
        return "—"
    return format(value, spec)


def _printable(text: str, *, keep_newlines: bool = False) -> str:
    r"""``text`` with control characters escaped (newlines kept when ``keep_newlines``).

    >>> _printable("a\x1b[31mb\nc")
    'a\\x1b[31mb\\nc'
    """
    if not keep_newlines:
        text = text.replace("\n", "\\n")
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group(0)):02x}", text)
