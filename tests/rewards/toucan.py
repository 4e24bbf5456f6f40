"""Rows shaped like the public Toucan preview file, and answers to them in the three layouts.

The public Toucan RL rows (``toucan_toolcall``) give ``gold_tool_calls`` as bare tool names, in
order, with no arguments and no steps; ``irrelevant`` rows have ``[]``. Tool names are MCP-style
(``<server>-<tool>``), the system prompt lists the schemas hermes-style, and later turns of a
conversation carry the earlier ones in ``prompt``.
"""

import json

from .rows import turn_break

THINK = "think-tool-server-think"
UI = [f"ui-reference-server-{t}" for t in ("list", "details", "examples", "search")]
CALC = [f"calculator-server-{t}" for t in ("add", "sub", "mul", "div")]


def schema(name):
    """An OpenAI-style function schema with one required string parameter."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The {name.rsplit('-', 1)[-1]} tool.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    }


def toucan_row(question, tools, gold, history=()):
    """One RL row as the public Toucan files hold it (``subset_name`` follows the gold)."""
    schemas = [schema(name) for name in tools]
    system = "You may call one or more functions.\n<tools>\n"
    system += "\n".join(json.dumps(s) for s in schemas) + "\n</tools>"
    return {
        "prompt": [
            {"content": system, "role": "system"},
            *history,
            {"content": question, "role": "user"},
        ],
        "data_source": "toucan_toolcall",
        "reward_model": {
            "ground_truth": {
                "allowed_tools": list(tools),
                "gold_tool_calls": list(gold),
                "question_content": question,
                "subset_name": "tool_call" if gold else "irrelevant",
                "tool_schemas": json.dumps(schemas),
            },
            "style": "rule",
        },
        "extra_info": {"need_tools_kwargs": False, "original_turn_index": len(history) // 2},
        "tools": json.dumps(schemas),
    }


PLAN = toucan_row("Plan a database migration step by step.", [THINK], [THINK])
FOLLOW_UP = toucan_row(
    "Could you turn that plan into a checklist?",
    [THINK],
    [],
    history=[
        {"content": "Plan a database migration step by step.", "role": "user"},
        {
            "content": f'<tool_call>\n{{"name": "{THINK}", "arguments": {{}}}}\n</tool_call>',
            "role": "assistant",
        },
        {"content": "<tool_response>\nplanned\n</tool_response>", "role": "user"},
        {"content": "Here is the plan.", "role": "assistant"},
    ],
)
UPLOAD = toucan_row(
    "Which UI components handle drag-and-drop uploads, with examples?",
    UI,
    [UI[3], UI[3], UI[0], UI[2], UI[2]],
)
CAREER = toucan_row("How should a teacher move into software development?", CALC, [])
ROWS = [PLAN, FOLLOW_UP, UPLOAD, CAREER]
"""Two ``tool_call`` rows (one call, five calls), two ``irrelevant`` rows."""


def truth(row):
    return row["reward_model"]["ground_truth"]


def hermes(name, arguments=None):
    """One call as a Qwen/hermes template writes it (arguments invented by the policy)."""
    args = {"query": f"about {name}"} if arguments is None else arguments
    return {"name": name, "arguments": args}


def answer(names, layout, reply="Done: here is what I found."):
    """The calls ``names`` in one of the three layouts, each followed by its tool response.

    ``tags``: one ``<tool_call>`` per call, all in one assistant turn; ``array``: one tag holding
    the JSON array of the calls; ``turns``: one call per assistant turn.
    """
    calls = [hermes(name) for name in names]
    if layout == "tags":
        turns = ["\n".join(f"<tool_call>\n{json.dumps(c)}\n</tool_call>" for c in calls)]
    elif layout == "array":
        turns = [f"<tool_call>\n{json.dumps(calls)}\n</tool_call>"]
    elif layout == "turns":
        turns = [f"<tool_call>\n{json.dumps(c)}\n</tool_call>" for c in calls]
    else:
        raise ValueError(layout)
    return "".join(turn + turn_break() for turn in turns) + reply


LAYOUTS = ("tags", "array", "turns")
