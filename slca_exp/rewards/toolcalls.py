"""Reading a decoded rollout: think blocks, ``<tool_call>`` blocks, tool responses, final reply.

Every scan here is linear in the length of the text: tags are found with ``str.find`` from a
moving position, never with a backtracking regex, so 10 MB of unclosed tags costs one pass.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from slca_exp.rewards.types import ToolCall

TOOL_CALL = ("<tool_call>", "</tool_call>")
THINK_OPEN = ("<think>", "<thinking>")
THINK_CLOSE = ("</think>", "</thinking>")
TOOL_RESPONSE = ("<tool_response>", "</tool_response>")


def blocks(text: str, open_tag: str, close_tag: str) -> list[tuple[int, int, int, int]]:
    """Spans of ``open_tag ... close_tag`` blocks, non-greedy and non-overlapping.

    A block starts at an opening tag and ends at the first closing tag after it (what the
    non-greedy regex ``open(.*?)close`` with DOTALL matches). An opening tag with no closing tag
    after it ends the scan.

    Returns:
        ``(start, content_start, content_end, end)`` per block: ``text[content_start:content_end]``
        is the content, ``text[start:end]`` the whole block.

    >>> blocks("a<b>x</b><b>y", "<b>", "</b>")
    [(1, 4, 5, 9)]

    """
    spans = []
    pos = 0
    while True:
        start = text.find(open_tag, pos)
        if start < 0:
            return spans
        content = start + len(open_tag)
        stop = text.find(close_tag, content)
        if stop < 0:
            return spans
        end = stop + len(close_tag)
        spans.append((start, content, stop, end))
        pos = end


def strip_think(text: str) -> str:
    """``text`` without its think blocks.

    A think block opens with ``<think>`` or ``<thinking>`` and ends at the first ``</think>`` or
    ``</thinking>`` after it, whichever comes first: a model that opens one tag and closes the
    other was still thinking, and what it drafted there is no call and no reply. An opening tag
    with no closing tag after it ends the scan (the rest stays). Linear in ``len(text)``.

    >>> strip_think("<think>plan</think>answer"), strip_think("<think>draft</thinking>answer")
    ('answer', 'answer')

    """
    if "<think" not in text:
        return text
    opens, closes = _Next(text, THINK_OPEN), _Next(text, THINK_CLOSE)
    parts, pos = [], 0
    while True:
        start, open_tag = opens.after(pos)
        if start < 0:
            break
        stop, close_tag = closes.after(start + len(open_tag))
        if stop < 0:
            break
        parts.append(text[pos:start])
        pos = stop + len(close_tag)
    parts.append(text[pos:])
    return "".join(parts)


class _Next:
    """The next occurrence of any of a few tags, from a position that only moves forward.

    Each tag's last find is remembered and searched again only once the position has passed it,
    so every tag's searches cover disjoint stretches of the text: linear overall.
    """

    def __init__(self, text: str, tags: tuple[str, ...]) -> None:
        self.text, self.tags = text, tags
        self.found = [-2] * len(tags)  # -2: not searched yet; -1: none left

    def after(self, pos: int) -> tuple[int, str]:
        """(index, tag) of the first tag starting at or after ``pos``; (-1, "") when none."""
        best, best_tag = -1, ""
        for i, tag in enumerate(self.tags):
            at = self.found[i]
            if at == -2 or 0 <= at < pos:
                at = self.found[i] = self.text.find(tag, pos)
            if at >= 0 and (best < 0 or at < best):
                best, best_tag = at, tag
        return best, best_tag


def block_contents(text: str, tags: tuple[str, str]) -> list[str]:
    """The stripped contents of the ``tags`` blocks of ``text`` (non-greedy), in order.

    >>> block_contents("<tool_call> {} </tool_call><tool_call>[]</tool_call>", TOOL_CALL)
    ['{}', '[]']

    """
    return [text[a:b].strip() for _, a, b, _ in blocks(text, *tags)]


def tool_responses(text: str) -> list[str]:
    """Contents of the ``<tool_response>`` blocks of a rollout, stripped, in order.

    >>> tool_responses("<tool_call>{}</tool_call><tool_response> 42 </tool_response>ok")
    ['42']

    """
    return block_contents(text, TOOL_RESPONSE)


def final_reply(text: str) -> str:
    r"""The text after the last ``</tool_response>`` (the whole text when there is none), stripped.

    Think blocks are removed first and the chat glue around the reply (``<|im_end|>``,
    ``<|im_start|>assistant``, or the bare role line left when special tokens were skipped in
    decoding) is dropped: the judge rates what the user would read.

    >>> final_reply("<tool_response>42</tool_response><|im_end|>\n<|im_start|>assistant\nIt's 42.")
    "It's 42."

    """
    text = strip_think(text)
    cut = text.rfind(TOOL_RESPONSE[1])
    tail = text if cut < 0 else text[cut + len(TOOL_RESPONSE[1]) :]
    return _strip_glue(tail)


def ends_on_tool_call(text: str) -> bool:
    """Whether the rollout's last assistant turn holds a ``<tool_call>`` (cut off before a reply).

    A rollout whose tool call was never answered (out of turns or out of tokens) has no summary;
    the last turn is read the way :func:`final_reply` reads it.

    >>> ends_on_tool_call("<tool_call>{}</tool_call><tool_response>4</tool_response>It's 4.")
    False
    >>> ends_on_tool_call("<tool_call>{}</tool_call><tool_response>4</tool_response><tool_call>{")
    True

    """
    return TOOL_CALL[0] in final_reply(text)


CHAT_GLUE = ("<|im_end|>", "<|im_start|>", "<|endoftext|>", "<|eot_id|>")
"""Chat-template control tokens: a decode with ``skip_special_tokens=True`` leaves them out."""


def _strip_glue(text: str) -> str:
    """Drop chat-template tokens and role lines at both ends of a reply."""
    while True:
        text = text.strip()
        head = next((g for g in CHAT_GLUE if text.startswith(g)), None)
        if head is not None:
            text = text[len(head) :]
            continue
        tail = next((g for g in CHAT_GLUE if text.endswith(g)), None)
        if tail is not None:
            text = text[: -len(tail)]
            continue
        first, _, rest = text.partition("\n")
        if first.strip() in ("assistant", "user", "tool") and rest:
            text = rest
            continue
        return text


@dataclass(frozen=True)
class Block:
    """One ``<tool_call>`` block.

    Attributes:
        turn: index of the assistant turn holding it (0-based; turns are the stretches of text
            between tool responses).
        calls: the calls it holds when it is well formed (empty otherwise).
        error: why it was rejected, or ``None`` when it is well formed.

    """

    turn: int
    calls: tuple[ToolCall, ...]
    error: str | None = None


@dataclass(frozen=True)
class ParsedCalls:
    """Everything the rewards need from the tool-call part of a rollout.

    Attributes:
        blocks: every complete ``<tool_call>..</tool_call>`` block, in order.
        open_tags: number of ``<tool_call>`` tags (think blocks removed).
        close_tags: number of ``</tool_call>`` tags.
        reasons: rejected block count per reason.

    """

    blocks: tuple[Block, ...] = ()
    open_tags: int = 0
    close_tags: int = 0
    reasons: dict[str, int] = field(default_factory=dict)

    @property
    def calls(self) -> list[ToolCall]:
        """Calls of the well-formed blocks, in order."""
        return [call for block in self.blocks for call in block.calls]

    @property
    def turns(self) -> list[list[ToolCall]]:
        """Calls of the well-formed blocks grouped per assistant turn (turns with calls only)."""
        grouped: dict[int, list[ToolCall]] = {}
        for block in self.blocks:
            if block.calls:
                grouped.setdefault(block.turn, []).extend(block.calls)
        return list(grouped.values())


def parse_tool_calls(
    text: str, *, skip_tool_responses: bool = False, decode_string_arguments: bool = True
) -> ParsedCalls:
    """Parse the ``<tool_call>`` blocks of a decoded rollout. Never raises; linear in ``len(text)``.

    Think blocks are removed first (:func:`strip_think`). A block holds a JSON object or an array
    of objects (surrounding whitespace ignored); each object needs a non-empty string ``name``.
    Its arguments are read the way the public HierR reward reads them: ``arguments``, or
    ``parameters`` when ``arguments`` is absent or empty (``null``, ``{}``, ``""``, ``0``,
    ``false``, ``[]``), or ``{}`` when both are; what is read must be a JSON object. A block with
    any bad call is rejected as a whole, with its reason counted. Tool names are not checked
    against the row's allowed tools here: that is the reward's business.

    Args:
        text: the decoded response (assistant turns, and tool responses when multi-turn).
        skip_tool_responses: ignore anything inside ``<tool_response>`` blocks (a tool may echo
            text that looks like a call); they still separate the assistant turns.
        decode_string_arguments: read arguments given as a string holding a JSON object (what
            some chat templates write) as that object; off, such a call is rejected, as the
            public reward does.

    Returns:
        :class:`ParsedCalls`.

    >>> parsed = parse_tool_calls('<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>')
    >>> parsed.calls
    [ToolCall(name='f', arguments={'x': 1}, turn=0)]
    >>> parse_tool_calls('<tool_call>{"name": "f", "arguments": null}</tool_call>').calls
    [ToolCall(name='f', arguments={}, turn=0)]

    """
    if not isinstance(text, str):
        return ParsedCalls(reasons={"response is not text": 1})
    text = strip_think(text)
    responses = blocks(text, *TOOL_RESPONSE)
    if skip_tool_responses and any("tool_call>" in text[a:b] for _, a, b, _ in responses):
        parts, pos = [], 0
        for start, _, _, end in responses:
            parts.append(text[pos:start])
            parts.append(TOOL_RESPONSE[0] + TOOL_RESPONSE[1])
            pos = end
        parts.append(text[pos:])
        text = "".join(parts)
        responses = blocks(text, *TOOL_RESPONSE)
    ends = [end for *_, end in responses]
    found: list[Block] = []
    reasons: Counter[str] = Counter()
    for start, a, b, _ in blocks(text, *TOOL_CALL):
        turn = bisect_right(ends, start)
        calls, error = _decode_block(text[a:b], turn, decode_string_arguments)
        if error is not None:
            reasons[error] += 1
        found.append(Block(turn, calls, error))
    # Renumber turns densely over the turns that hold a block: 0, 1, 2, ...
    order = {turn: i for i, turn in enumerate(sorted({block.turn for block in found}))}
    if any(order[block.turn] != block.turn for block in found):
        found = [
            Block(order[b.turn], tuple(_in_turn(c, order[b.turn]) for c in b.calls), b.error)
            for b in found
        ]
    return ParsedCalls(
        tuple(found), text.count(TOOL_CALL[0]), text.count(TOOL_CALL[1]), dict(reasons)
    )


def _in_turn(call: ToolCall, turn: int) -> ToolCall:
    return ToolCall(call.name, call.arguments, turn)


def _decode_block(
    content: str, turn: int, decode_strings: bool
) -> tuple[tuple[ToolCall, ...], str | None]:
    content = content.strip()
    try:
        value = json.loads(content)
    except RecursionError:
        return (), "JSON nested too deep"
    except ValueError:
        return (), "invalid JSON"
    items = [value] if isinstance(value, dict) else value
    if not isinstance(items, list):
        return (), "not a JSON object or array"
    calls = []
    for item in items:
        if not isinstance(item, dict):
            return (), "array item is not an object"
        name = item.get("name")
        if not isinstance(name, str) or not name:
            return (), "name missing, empty or not a string"
        # An empty or null `arguments` falls through to `parameters`, then to {}.
        args = item.get("arguments") or item.get("parameters") or {}
        if isinstance(args, str) and decode_strings:
            args = _object_from_string(args)
        if not isinstance(args, dict):
            return (), "arguments not a JSON object"
        calls.append(ToolCall(name, args, turn))
    return tuple(calls), None


def _object_from_string(text: str) -> Any:  # noqa: ANN401 - whatever the JSON holds
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None
