"""The row layout of every split, its writers, and :func:`check_rows`, which finds bad rows.

A row is verl's RL row with the Toucan/SLCA ground truth the HierR reward reads
(``slca_exp.rewards.gold``). Every nested value whose shape varies from row to row (calls, schemas,
responses, messages) is a JSON string, so one parquet schema fits every row and every reader
(pyarrow, pandas, HF datasets) agrees on it.

``data_source`` (str)
    ``"slca_synthetic"`` for generated rows; anything for user files.
``prompt`` (list of ``{"role", "content"}``)
    the system message, then the user's question: what the policy is asked.
``ability`` (str)
    ``"tool_call"``.
``reward_model`` (``{"style": "rule", "ground_truth": {...}}``), the ground truth holding
    ``allowed_tools`` (list of tool names the row allows; synthetic rows: all six of the domain,
    so the prompt is the same for every row and the policy must pick the tool from the question),
    ``gold_tool_calls`` (JSON string: a list of steps, each a list of ``{"name", "arguments"}``;
    ``"[]"`` on irrelevant rows), ``question_content`` (the question), ``subset_name``
    (``"tool_call"`` or ``"irrelevant"``) and ``tool_schemas`` (JSON string: a list of OpenAI
    function schemas ``{"type": "function", "function": {name, description, parameters}}``).
    It must read cleanly with :func:`slca_exp.rewards.read_gold`.
``extra_info`` (``{"index", "split", "tool_responses", "reply"}``)
    ``index``: the row's position in its file; ``split``: ``sft`` | ``train`` | ``val``;
    ``tool_responses``: JSON string, a list of ``{"name", "arguments", "content"}``, the
    recorded response of each gold call in order (the replay simulator's ``SimContext.recorded``);
    ``reply``: the gold final reply, which states the facts of those responses.
``messages`` (SFT rows only; JSON string)
    the gold trajectory in OpenAI chat format: system, user, one assistant message per step with
    ``content: ""`` and all of the step's calls under ``tool_calls`` (``{"type": "function",
    "function": {"name", "arguments": {...}}}``), one ``{"role": "tool", "name", "content"}``
    message per call, then ``{"role": "assistant", "content": reply}``. Irrelevant rows: system,
    user, assistant reply.

Rows of user files (``data.kind=files``, ``data=toucan``) need only what the rewards and the
engine read: ``prompt`` with a user message and a ``reward_model.ground_truth`` that ``read_gold``
accepts (with readable ``tool_schemas`` when present) and that the reward can score: a row with
gold calls must allow tools (``allowed_tools`` not empty), every gold call must name an allowed
tool (otherwise even the exact gold call is an invalid call); ``extra_info.tool_responses``, when
present, must be a list of such responses; SFT rows need ``messages``. Rows whose
``data_source`` is ``slca_synthetic`` are held to the whole layout above. The public Toucan rows
(gold calls as bare tool names, no ``extra_info.tool_responses``) pass as they are.

Code that reads a row reads it through one view, :class:`slca_exp.core.rows.Row`:
``prompt()``, ``truth()``, ``question()``, ``tools()``, ``allowed()``, ``recorded()`` and
``messages()`` each take a JSON-encoded field as its string or already decoded, so the engines,
the rewards and the simulators agree on every row that passes :func:`check_rows`. This module
writes rows (:func:`rl_row`, :func:`sft_row`) and checks them; the view only reads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from slca_exp.core.rows import Row, RowError, decoded, is_list
from slca_exp.rewards.gold import Gold, GroundTruthError, read_gold

DATA_SOURCE = "slca_synthetic"
ABILITY = "tool_call"
SUBSETS = ("tool_call", "irrelevant")
ROLES = ("system", "user", "assistant", "tool")
MAX_REPORTED = 10
"""At most this many bad rows are described one by one (the count covers all of them)."""


def rl_row(
    *,
    index: int,
    split: str,
    system: str,
    question: str,
    steps: list[list[dict[str, Any]]],
    responses: list[dict[str, Any]],
    reply: str,
    schemas: list[dict[str, Any]],
) -> dict[str, Any]:
    """Assemble one row in the layout above (``messages`` is added by :func:`sft_row`)."""
    return {
        "data_source": DATA_SOURCE,
        "prompt": [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ],
        "ability": ABILITY,
        "reward_model": {
            "style": "rule",
            "ground_truth": {
                "allowed_tools": [s["function"]["name"] for s in schemas],
                "gold_tool_calls": _dumps(steps),
                "question_content": question,
                "subset_name": "tool_call" if steps else "irrelevant",
                "tool_schemas": _dumps(schemas),
            },
        },
        "extra_info": {
            "index": index,
            "split": split,
            "tool_responses": _dumps(responses),
            "reply": reply,
        },
    }


def gold_messages(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The gold trajectory of a row in OpenAI chat format (see ``messages`` above)."""
    view = Row(row)
    steps = json.loads(view.truth()["gold_tool_calls"])
    responses = iter(view.recorded())
    messages = [dict(m) for m in view.prompt()]
    for step in steps:
        calls = [{"type": "function", "function": dict(call)} for call in step]
        messages.append({"role": "assistant", "content": "", "tool_calls": calls})
        for _ in step:
            response = next(responses)
            messages.append(
                {"role": "tool", "name": response["name"], "content": response["content"]}
            )
    messages.append({"role": "assistant", "content": row["extra_info"]["reply"]})
    return messages


def sft_row(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with its ``messages`` (the gold trajectory as a JSON string)."""
    return {**row, "messages": _dumps(gold_messages(row))}


def hermes_text(row: Mapping[str, Any]) -> str:
    """The gold response of a row as hermes text: what a perfect rollout decodes to.

    One ``<tool_call>`` block per call (the calls of a step back to back), then one
    ``<tool_response>`` block per response, per step; then the final reply.
    """
    parts = []
    for message in gold_messages(row)[2:]:
        if message.get("tool_calls"):
            parts += [
                f"<tool_call>\n{_call_json(c['function'])}\n</tool_call>"
                for c in message["tool_calls"]
            ]
        elif message["role"] == "tool":
            parts.append(f"<tool_response>\n{message['content']}\n</tool_response>")
        else:
            parts.append(message["content"])
    return "\n".join(parts)


def check_rows(rows: Sequence[Any], split: str) -> list[str]:
    """Every way the rows break the layout, as ``"row 3: ..."`` lines (empty: all good).

    Args:
        rows: the split's rows (dicts from ``pyarrow``'s ``to_pylist`` or pandas' records; lists
            may be numpy arrays).
        split: ``sft`` | ``train`` | ``val``; SFT rows also need ``messages``.

    Returns:
        one line per bad row (at most :data:`MAX_REPORTED`, then a count of the rest).

    >>> check_rows([{"prompt": []}], "train")[0]
    'row 0: prompt has no user message; reward_model.ground_truth is missing'

    """
    bad = bad_rows(rows, split)
    lines = [f"row {i}: {what}" for i, what in bad[:MAX_REPORTED]]
    if len(bad) > MAX_REPORTED:
        lines.append(f"... and {len(bad) - MAX_REPORTED} more bad rows ({len(bad)} of {len(rows)})")
    return lines


def bad_rows(rows: Sequence[Any], split: str) -> list[tuple[int, str]]:
    """``(index, what is wrong)`` for every row that breaks the layout, in order."""
    out = []
    for i, row in enumerate(rows):
        found = _row_problems(row, i, split)
        if found:
            out.append((i, "; ".join(found)))
    return out


def _row_problems(row: Any, index: int, split: str) -> list[str]:  # noqa: ANN401
    if not isinstance(row, Mapping):
        return [f"not an object (got {type(row).__name__})"]
    out = _prompt_problems(row.get("prompt"))
    gold = None
    reward_model = row.get("reward_model")
    if not isinstance(reward_model, Mapping) or reward_model.get("ground_truth") is None:
        out.append("reward_model.ground_truth is missing")
    else:
        try:
            gold = read_gold(reward_model["ground_truth"])
            _ = gold.tool_schemas  # parsed lazily by read_gold: check it here, once
        except GroundTruthError as err:
            out.append(str(err).replace("ground_truth.", "reward_model.ground_truth.", 1))
            gold = None
        else:
            out += _unscorable(gold)
    extra = row.get("extra_info")
    if extra is not None and not isinstance(extra, Mapping):
        out.append("extra_info must be an object")
        extra = None
    responses = _responses(extra, out)
    messages = row.get("messages")
    if split == "sft":
        messages = _messages(messages, out)
    if row.get("data_source") == DATA_SOURCE and not out:
        out += _synthetic_problems(row, index, split, gold, responses, messages)
    return out


def _prompt_problems(prompt: Any) -> list[str]:  # noqa: ANN401
    if not is_list(prompt):
        return ["prompt must be a list of {role, content} messages"]
    out = []
    for j, m in enumerate(prompt):
        if not isinstance(m, Mapping) or m.get("role") not in ROLES:
            out.append(f"prompt[{j}] needs a role in {'|'.join(ROLES)}")
        elif not isinstance(m.get("content"), str):
            out.append(f"prompt[{j}].content must be a string")
    if not out and not any(m["role"] == "user" for m in prompt):
        out.append("prompt has no user message")
    return out


def _responses(extra: Mapping[str, Any] | None, out: list[str]) -> list[Any] | None:
    if extra is None or extra.get("tool_responses") is None:
        return None
    value = _loads(extra["tool_responses"])
    if not is_list(value) or not all(
        isinstance(r, Mapping) and isinstance(r.get("name"), str) and "content" in r for r in value
    ):
        out.append("extra_info.tool_responses must be a JSON list of {name, arguments, content}")
        return None
    return list(value)


def _messages(value: Any, out: list[str]) -> list[Any] | None:  # noqa: ANN401
    messages = _loads(value)
    if not is_list(messages) or not messages:
        out.append("messages (the SFT trajectory) must be a non-empty JSON list of chat messages")
        return None
    for j, m in enumerate(messages):
        if not isinstance(m, Mapping) or m.get("role") not in ROLES:
            out.append(f"messages[{j}] needs a role in {'|'.join(ROLES)}")
            return None
    if messages[-1]["role"] != "assistant":
        out.append("messages must end with the assistant's reply")
    return list(messages)


def _synthetic_problems(
    row: Mapping[str, Any],
    index: int,
    split: str,
    gold: Gold | None,
    responses: list[Any] | None,
    messages: list[Any] | None,
) -> list[str]:
    """The whole layout, for rows that say they are synthetic."""
    gt = row["reward_model"]["ground_truth"]
    extra = row.get("extra_info") or {}
    out = []
    if row.get("ability") != ABILITY:
        out.append(f"ability must be {ABILITY!r}")
    if gold is None or not isinstance(gt, Mapping):
        return [*out, "reward_model.ground_truth must be an object"]
    for key in ("gold_tool_calls", "tool_schemas"):
        if not isinstance(gt.get(key), str):
            out.append(f"reward_model.ground_truth.{key} must be a JSON string")
    schemas = gold.tool_schemas or {}
    if not gold.allowed or set(schemas) != set(gold.allowed):
        out.append("reward_model.ground_truth.tool_schemas must describe exactly allowed_tools")
    expected = "tool_call" if gold.needs_call else "irrelevant"
    if gold.subset != expected:
        out.append(f"reward_model.ground_truth.subset_name must be {expected!r}")
    if gold.question != Row(row).prompt()[-1]["content"]:
        out.append("question_content must equal the user message")
    if extra.get("index") != index:
        out.append(f"extra_info.index must be {index} (the row's position)")
    if extra.get("split") != split:
        out.append(f"extra_info.split must be {split!r}")
    if not isinstance(extra.get("reply"), str) or not extra["reply"].strip():
        out.append("extra_info.reply must be the gold reply")
    recorded = [(r.get("name"), r.get("arguments")) for r in responses or []]
    if responses is None or recorded != [(c.name, c.arguments) for c in gold.calls]:
        out.append("extra_info.tool_responses must hold one response per gold call, in order")
    if split == "sft" and messages is not None and not out and messages != gold_messages(row):
        out.append("messages must be the gold trajectory of the row")
    return out


def _unscorable(gold: Gold) -> list[str]:
    """Why the HierR reward could not score the row's gold calls (empty: it can)."""
    if not gold.needs_call:
        return []
    if not gold.allowed:
        return [
            "reward_model.ground_truth.allowed_tools is empty but the row has gold calls: no "
            "call can be valid (list the row's tools in allowed_tools, or drop the row)"
        ]
    outside = sorted({c.name for c in gold.calls} - gold.allowed)
    if outside:
        return [
            f"reward_model.ground_truth.gold_tool_calls name tools outside allowed_tools: "
            f"{outside} (the exact gold call would score as invalid; add them to allowed_tools, "
            "or drop the row)"
        ]
    return []


def _loads(value: Any) -> Any:  # noqa: ANN401
    """``value`` with JSON text decoded; ``None`` for text that is not JSON (reported as such)."""
    try:
        return decoded(value)
    except RowError:
        return None


def _call_json(function: Mapping[str, Any]) -> str:
    return json.dumps(
        {"name": function["name"], "arguments": function.get("arguments", {})},
        ensure_ascii=False,
    )


def _dumps(value: Any) -> str:  # noqa: ANN401
    # Compact, keys in insertion order (name before arguments, role before content): the rows
    # are built in a fixed order, so the same row is the same bytes on every machine.
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
