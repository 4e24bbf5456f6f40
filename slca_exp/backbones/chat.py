r"""The hermes / ChatML chat layout shared by the template, the rollouts and SFT.

The layout is Qwen2.5's (what verl's hermes tool parser reads) with a
compact tools list in the system turn, one line per tool, to keep prompts short for a CPU model::

    <|im_start|>system
    You answer with tools.

    # Tools
    get_weather(city: string, unit?: C|F): Current weather
    Call: <tool_call>{"name":...,"arguments":{...}}</tool_call><|im_end|>
    <|im_start|>user
    Weather in Paris?<|im_end|>
    <|im_start|>assistant
    <tool_call>
    {"name":"get_weather","arguments":{"city":"Paris"}}
    </tool_call><|im_end|>
    <|im_start|>user
    <tool_response>
    {"temp":21}
    </tool_response><|im_end|>
    <|im_start|>assistant
    It is 21 degrees.<|im_end|>

The policy generates each assistant turn's content and its ``<|im_end|>``; everything else (the
prompt, the tool-response turn and the next ``<|im_start|>assistant\n``) is written by the
environment and never learned. The functions here are pure string and token bookkeeping over a
tokenizer's ``apply_chat_template``; they work with any template that keeps this layout
(:func:`check_template` says whether one does).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

PAD = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (PAD, IM_START, IM_END)
"""Control tokens: dropped by ``decode(skip_special_tokens=True)``."""
TEXT_TOKENS = (
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
"""Single tokens that decode as text, so the reward parser still sees them after decoding."""
GENERATION_PROMPT = f"{IM_START}assistant\n"
"""What the environment writes before every assistant turn."""

TEMPLATE = r"""{#- slca-exp hermes-compact v1: Qwen2.5 ChatML layout, one line per tool -#}
{%- set ns = namespace(first=0) -%}
{%- if messages and messages[0].role == 'system' -%}
  {%- set ns.first = 1 -%}
  {{- '<|im_start|>system\n' + messages[0].content -}}
  {%- if tools -%}{{- '\n\n' -}}{%- endif -%}
{%- elif tools -%}
  {{- '<|im_start|>system\n' -}}
{%- endif -%}
{%- if tools -%}
  {{- '# Tools\n' -}}
  {%- for tool in tools -%}
    {%- set fn = tool.function if tool.function is defined else tool -%}
    {%- set params = fn.parameters if fn.parameters is defined and fn.parameters else {} -%}
    {%- set props = params.properties if params.properties is defined else {} -%}
    {%- set required = params.required if params.required is defined else [] -%}
    {{- fn.name + '(' -}}
    {%- for arg, spec in props.items() -%}
      {%- if not loop.first -%}{{- ', ' -}}{%- endif -%}
      {{- arg + ('' if arg in required else '?') + ': ' -}}
      {%- if spec.enum is defined -%}{{- spec.enum | join('|') -}}
      {%- elif spec.type is string -%}{{- spec.type -}}
      {%- elif spec.type is defined -%}{{- spec.type | join('|') -}}
      {%- else -%}{{- 'any' -}}{%- endif -%}
    {%- endfor -%}
    {{- ')' -}}
    {%- if fn.description -%}{{- ': ' + fn.description -}}{%- endif -%}
    {{- '\n' -}}
  {%- endfor -%}
  {{- 'Call: <tool_call>{"name":...,"arguments":{...}}</tool_call>' -}}
{%- endif -%}
{%- if ns.first or tools -%}{{- '<|im_end|>\n' -}}{%- endif -%}
{%- for message in messages[ns.first:] -%}
  {%- if message.content is string -%}{%- set content = message.content -%}
  {%- elif message.content is none or message.content is undefined -%}{%- set content = '' -%}
  {%- else -%}{%- set content = message.content | tojson -%}{%- endif -%}
  {%- if message.role == 'user' or message.role == 'system' -%}
    {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>\n' -}}
  {%- elif message.role == 'assistant' -%}
    {{- '<|im_start|>assistant\n' + content -}}
    {%- for call in (message.tool_calls or []) -%}
      {%- set fn = call.function if call.function is defined else call -%}
      {%- if content or not loop.first -%}{{- '\n' -}}{%- endif -%}
      {{- '<tool_call>\n{"name":' + (fn.name | tojson) + ',"arguments":' -}}
      {%- if fn.arguments is string -%}{{- fn.arguments -}}
      {%- elif fn.arguments is defined and fn.arguments is not none -%}
        {{- fn.arguments | tojson(separators=(',', ':')) -}}
      {%- else -%}{{- '{}' -}}{%- endif -%}
      {{- '}\n</tool_call>' -}}
    {%- endfor -%}
    {{- '<|im_end|>\n' -}}
  {%- elif message.role == 'tool' -%}
    {%- if loop.first or loop.previtem.role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
    {{- '\n<tool_response>\n' + content + '\n</tool_response>' -}}
    {%- if loop.last or loop.nextitem.role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
  {%- else -%}
    {{- raise_exception('unknown message role: ' + message.role) -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""
"""The built-in chat template (``backbone=tiny``; usable as ``backbone.chat_template`` too)."""


def template_sha256(template: str | dict[str, str]) -> str:
    """sha256 (hex) of a chat template's text (of the canonical JSON for named templates)."""
    if isinstance(template, dict):
        template = json.dumps(template, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(template.encode("utf-8")).hexdigest()


TEMPLATE_SHA256 = template_sha256(TEMPLATE)
"""Recorded in the recipe for ``backbone.source=builtin``."""

Messages = Sequence[dict[str, Any]]
Tools = Sequence[dict[str, Any]] | str | None


def render_prompt(tokenizer: Any, messages: Messages, tools: Tools = None) -> str:  # noqa: ANN401
    r"""The prompt of a rollout: ``messages`` (system, user) and the generation prompt.

    Args:
        tokenizer: a tokenizer with a chat template.
        messages: OpenAI-style messages, typically ``[system, user]``.
        tools: OpenAI function schemas, as a list or as the JSON string of one (the RL rows'
            ``reward_model.ground_truth.tool_schemas``); None for none.

    Returns:
        The text, ending with ``<|im_start|>assistant\n``.

    """
    return _render(tokenizer, messages, tools, generation_prompt=True)


def render_text(messages: Messages, tools: Tools = None, *, generation_prompt: bool = False) -> str:
    """``messages`` rendered with the built-in :data:`TEMPLATE`, no tokenizer needed.

    What the engine feeds the builtin tokenizer's training (the tokenizer does not exist yet).
    """
    from transformers.utils.chat_template_utils import render_jinja_template

    if isinstance(tools, str):
        tools = json.loads(tools)
    rendered, _ = render_jinja_template(
        [list(messages)],
        tools=list(tools) if tools else None,
        chat_template=TEMPLATE,
        add_generation_prompt=generation_prompt,
    )
    return rendered[0]


def tool_turn_text(responses: Sequence[str]) -> str:
    r"""The text between an assistant turn's ``<|im_end|>`` and the next assistant's content.

    This is what the environment appends after an assistant turn that made tool calls: one user
    turn holding every response of that turn (parallel calls share it), then the generation
    prompt. So ``prompt + turn_1 + tool_turn_text(r) + turn_2 + "\n"`` equals the template's
    rendering of the whole trajectory, where ``turn_i`` is a generated content plus ``<|im_end|>``.

    >>> tool_turn_text(["1", "2"])
    '\n<|im_start|>user\n<tool_response>\n1\n</tool_response>\n<tool_response>\n2\n</tool_response><|im_end|>\n<|im_start|>assistant\n'

    Raises:
        ValueError: no responses (a turn without calls is not followed by a tool turn).

    """
    if not responses:
        raise ValueError("tool_turn_text needs at least one tool response")
    body = "".join(f"\n<tool_response>\n{r}\n</tool_response>" for r in responses)
    return f"\n{IM_START}user{body}{IM_END}\n{GENERATION_PROMPT}"


def render_trajectory(
    tokenizer: Any,  # noqa: ANN401
    messages: Messages,
    tools: Tools = None,
    *,
    generation_prompt: bool = False,
) -> tuple[str, list[tuple[int, int]]]:
    """A whole trajectory as text, with the character spans the policy generates.

    Args:
        tokenizer: a tokenizer with a chat template in the hermes / ChatML layout.
        messages: system, user, then assistant turns (with ``tool_calls``), ``tool`` messages
            and the final assistant reply.
        tools: the tool schemas (list or JSON string), or None.
        generation_prompt: end with the generation prompt (a trajectory that ends on tool turns).

    Returns:
        ``(text, spans)``: ``text`` is ``apply_chat_template`` of the trajectory; ``spans`` holds
        one ``(start, end)`` per assistant message, covering its content (tool-call blocks
        included) and its closing ``<|im_end|>``, in order.

    Raises:
        ValueError: the template renders an earlier part of the trajectory differently from the
            whole (not prefix-stable) or an assistant turn without ``<|im_end|>``.

    """
    text = _render(tokenizer, messages, tools, generation_prompt=generation_prompt)
    spans = []
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        prefix = _render(tokenizer, messages[:i], tools, generation_prompt=True)
        if not text.startswith(prefix):
            raise ValueError(
                f"the chat template renders messages[:{i}] + generation prompt differently from "
                "the start of the whole trajectory; its assistant turns cannot be located"
            )
        end = text.find(IM_END, len(prefix))
        if end < 0:
            raise ValueError(f"the chat template closes assistant message {i} without {IM_END}")
        spans.append((len(prefix), end + len(IM_END)))
    return text, spans


def tokenize_trajectory(
    tokenizer: Any,  # noqa: ANN401
    messages: Messages,
    tools: Tools = None,
    max_len: int | None = None,
) -> tuple[list[int], list[int]]:
    """Token ids and loss mask of a trajectory for SFT.

    The text is tokenized piece by piece, the way a rollout is built: the prompt, each generated
    assistant turn, each tool turn (the glue between turns) separately. So the mask is exact: 1 on
    every token of an assistant span (content and ``<|im_end|>``), 0 on system, user and tool
    glue. The template's newline after the last ``<|im_end|>`` is not tokenized: a rollout ends
    at its end-of-turn token.

    Args:
        tokenizer: a tokenizer with a chat template in the hermes / ChatML layout.
        messages: the trajectory (see :func:`render_trajectory`).
        tools: the tool schemas (list or JSON string), or None.
        max_len: keep at most this many tokens (the first ones); None keeps all.

    Returns:
        ``(input_ids, loss_mask)``, two lists of equal length.

    """
    text, spans = render_trajectory(tokenizer, messages, tools)
    pieces, learnable, pos = [], [], 0
    for start, end in spans:
        if start > pos:
            pieces.append(text[pos:start])
            learnable.append(0)
        pieces.append(text[start:end])
        learnable.append(1)
        pos = end
    if not spans:
        pieces, learnable = [text], [0]
    encoded = tokenizer(pieces, add_special_tokens=False)["input_ids"]
    input_ids: list[int] = []
    loss_mask: list[int] = []
    for ids, flag in zip(encoded, learnable, strict=True):
        input_ids.extend(ids)
        loss_mask.extend([flag] * len(ids))
    if max_len is not None:
        input_ids, loss_mask = input_ids[:max_len], loss_mask[:max_len]
    return input_ids, loss_mask


PROBE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "probe",
            "description": "A probe tool.",
            "parameters": {
                "type": "object",
                "properties": {"x": {"type": "integer"}},
                "required": ["x"],
            },
        },
    }
]
PROBE = [
    {"role": "system", "content": "S"},
    {"role": "user", "content": "U"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": "probe", "arguments": {"x": 1}}},
            {"type": "function", "function": {"name": "probe", "arguments": {"x": 2}}},
        ],
    },
    {"role": "tool", "name": "probe", "content": "R1"},
    {"role": "tool", "name": "probe", "content": "R2"},
    {"role": "assistant", "content": "A"},
]
"""A two-step trajectory with parallel calls, rendered by :func:`check_template`."""


def check_template(tokenizer: Any) -> str | None:  # noqa: ANN401
    """Why the tokenizer's chat template does not fit the rollout layout, or None when it does.

    The local engine writes the generation prompt and :func:`tool_turn_text` itself; a template
    that renders tool turns differently would make SFT and RL see different texts.
    """
    try:
        prompt = render_prompt(tokenizer, PROBE[:2], PROBE_TOOLS)
        text, spans = render_trajectory(tokenizer, PROBE, PROBE_TOOLS)
    except Exception as exc:  # noqa: BLE001 - any template failure is a misfit, reported as such
        return f"rendering a probe trajectory failed: {type(exc).__name__}: {exc}"
    if not prompt.endswith(GENERATION_PROMPT):
        return f"the generation prompt is not {GENERATION_PROMPT!r}"
    if len(spans) != 2 or not text.startswith(prompt) or spans[0][0] != len(prompt):
        return "the prompt is not a prefix of the rendered trajectory"
    glue = text[spans[0][1] : spans[1][0]]
    expected = tool_turn_text(["R1", "R2"])
    if glue != expected:
        return f"tool responses are rendered as {glue!r}, not {expected!r}"
    return None


def _render(tokenizer: Any, messages: Messages, tools: Tools, *, generation_prompt: bool) -> str:  # noqa: ANN401
    if isinstance(tools, str):
        tools = json.loads(tools)
    text = tokenizer.apply_chat_template(
        list(messages),
        tools=list(tools) if tools else None,
        tokenize=False,
        add_generation_prompt=generation_prompt,
    )
    if not isinstance(text, str):
        raise TypeError(f"apply_chat_template returned {type(text).__name__}, expected str")
    return text
