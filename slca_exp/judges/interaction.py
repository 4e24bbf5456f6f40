"""The ``interaction`` view (``reward.judge_view``): a rollout as the public v8.2 judge saw it.

The public SLCA-GRPO code's v8.2 reward (``analysis/hierr_sweep/reward_fn_hierr_v82.py``, the one
its ablations and HierR sweep ran with) shows its summary judge every tool call and every tool
response, not only the responses as the main reward does::

    rollout text --drop chat control tokens--> the text verl handed the public reward
      --every <tool_call>, then every <tool_response>--> [Tool Call 1] ... [Tool Response 1] ...
      --v8.2's final-response rule---------------------> the reply the judge rates

Calls and responses are listed in two runs (all calls first, then all responses), as v8.2 lists
them, not interleaved turn by turn; calls drafted inside think blocks are listed too, since v8.2
reads the blocks of the raw text. The reply is read by v8.2's own rule, which differs from
:func:`~slca_exp.rewards.toolcalls.final_reply` where a rollout has no tool response (below).

Control tokens: verl decodes a response for its reward function with special tokens skipped, so
v8.2 never saw ``<|im_end|>`` or ``<|im_start|>`` (the role lines they open, ``assistant``,
``user``, stay). Our engines decode with them kept; dropping them first makes the view of a
rollout the one v8.2 had of the same tokens, and leaves a text without them unchanged.
"""

from __future__ import annotations

from slca_exp.rewards.toolcalls import (
    CHAT_GLUE,
    TOOL_CALL,
    TOOL_RESPONSE,
    block_contents,
    strip_think,
)


def as_decoded(text: str) -> str:
    """``text`` without chat control tokens: what verl's reward decoding yields for it.

    >>> as_decoded("<tool_call>{}</tool_call><|im_end|><|im_start|>user")
    '<tool_call>{}</tool_call>user'

    """
    for token in CHAT_GLUE:
        if token in text:
            text = text.replace(token, "")
    return text


def tool_interactions(text: str) -> str:
    """Every tool call, then every tool response, numbered, as v8.2 showed them to its judge.

    Each entry is a ``[Tool Call i]`` or ``[Tool Response i]`` line followed by the block's
    stripped content; entries are separated by a blank line; no blocks give ``""``.

    >>> print(tool_interactions("<tool_call> {} </tool_call><tool_response>4</tool_response>"))
    [Tool Call 1]
    {}
    <BLANKLINE>
    [Tool Response 1]
    4

    """
    text = as_decoded(text)
    calls, responses = block_contents(text, TOOL_CALL), block_contents(text, TOOL_RESPONSE)
    entries = [f"[Tool Call {i}]\n{c}" for i, c in enumerate(calls, 1)]
    entries += [f"[Tool Response {i}]\n{r}" for i, r in enumerate(responses, 1)]
    # An empty last content leaves a trailing newline, which v8.2's final strip removes.
    return "\n\n".join(entries).strip()


def final_response(text: str) -> str:
    """The reply v8.2's judge rated, by v8.2's rule (think blocks removed first).

    1. The text after the last ``</tool_response>``, stripped, when it is not empty.
    2. Otherwise, when there is a ``</tool_call>``: the text after the last one, stripped, unless
       it is empty, holds a ``<tool_response>`` or starts with ``<tool_call>`` (then ``""``).
    3. Otherwise the whole text, stripped (it has no complete ``<tool_call>`` block to remove).

    So a rollout that called a tool and got no response has the text after its call as reply,
    and one whose last tool response is followed by nothing has none.

    >>> final_response('<tool_call>{}</tool_call> It is 4.'), final_response("No tools: 4.")
    ('It is 4.', 'No tools: 4.')
    >>> final_response("<tool_call>{}</tool_call><tool_response>4</tool_response>")
    ''

    """
    text = strip_think(as_decoded(text))
    cut = text.rfind(TOOL_RESPONSE[1])
    if cut >= 0:
        tail = text[cut + len(TOOL_RESPONSE[1]) :].strip()
        if tail:
            return tail
    cut = text.rfind(TOOL_CALL[1])
    if cut < 0:
        return text.strip()
    tail = text[cut + len(TOOL_CALL[1]) :].strip()
    if TOOL_RESPONSE[0] in tail or tail.startswith(TOOL_CALL[0]):
        return ""
    return tail
