"""Hypothesis strategies: ground truths in every accepted shape and hermes-style responses.

Responses mix well-formed calls (objects and arrays), every way of giving arguments (an object,
a JSON string, ``null``, empty values falling through to ``parameters``, none), malformed blocks,
unclosed and stray tags, think blocks (matched, mismatched, unclosed) and tool responses; some
calls copy a gold call with its values rewritten into look-alikes (``"1"`` for ``True``, a list's
repr, NaN), so that the value comparison is exercised, not only the misses.
"""

from __future__ import annotations

import json

from hypothesis import strategies as st

NAMES = ("f", "g")
"""Tool names rows may allow and gold calls may use (few, so that calls share names)."""
KEYS = ("a", "b")
VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 2),
    st.sampled_from([0.0, 1.0, 1.5, 1e-9, 1e-10, 1.0000000001, float("nan"), float("inf")]),
    st.sampled_from(["1", "0", "true", "false", " True ", "1.0", "0.0", "nan", "NaN", "x", "X "]),
    st.sampled_from(["", "[1, 2]", "{'a': 1}", "[1,2]", "inf", "1_0", "+1"]),
    st.lists(st.integers(0, 2), max_size=2),
    st.dictionaries(st.sampled_from("ab"), st.integers(0, 1), max_size=2),
)
ARGS = st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=2)
LOOKALIKES = (
    lambda v: v,
    str,
    lambda v: json.dumps(v),
    lambda v: str(v).upper(),
    lambda v: [v],
)
PADDING = st.sampled_from(["", "\n", " ", "\t", "\xa0", "\n \n"])


@st.composite
def gold_call(draw):
    """One gold call: a bare name, or ``{name, arguments | parameters}`` in any accepted form."""
    name = draw(st.sampled_from(NAMES))
    args = draw(ARGS)
    form = draw(
        st.sampled_from(["args", "args", "name", "string", "params", "null", "none", "both"])
    )
    return {
        "name": name,
        "args": {"name": name, "arguments": args},
        "string": {"name": name, "arguments": json.dumps(args)},
        "params": {"name": name, "parameters": args},
        "null": {"name": name, "arguments": None, "parameters": args},
        "none": {"name": name},
        "both": {"name": name, "arguments": args, "parameters": draw(ARGS)},
    }[form]


@st.composite
def ground_truths(draw):
    """``reward_model.ground_truth`` of a row: nested (empty steps too), flat, names, JSON."""
    calls = st.lists(gold_call(), min_size=1, max_size=3)
    shape = draw(st.sampled_from(["nested", "flat", "names", "empty"]))
    if shape == "nested":
        gold = draw(st.lists(st.one_of(calls, st.just([])), min_size=1, max_size=3))
    elif shape == "flat":
        gold = draw(st.one_of(calls, st.just([])))
    elif shape == "names":
        gold = draw(st.lists(st.sampled_from(NAMES), max_size=4))
    else:
        gold = []
    if draw(st.booleans()):
        gold = json.dumps(gold)  # as the parquet files store it
    allowed = draw(st.lists(st.sampled_from([*NAMES, "h"]), unique=True, max_size=3))
    if draw(st.integers(0, 4)) < 4:  # mostly, as in real rows, the gold tools are allowed
        allowed = sorted({c["name"] for c in _flat_gold(gold)} | set(allowed))
    return {"allowed_tools": allowed, "gold_tool_calls": gold, "question_content": "q"}


def _flat_gold(gold):
    gold = json.loads(gold) if isinstance(gold, str) else gold
    items = [c for step in gold for c in step] if gold and isinstance(gold[0], list) else gold
    return [{"name": c} if isinstance(c, str) else c for c in items]


@st.composite
def call_object(draw, gold):
    """A call as the policy writes it; sometimes a look-alike copy of a gold call."""
    if gold and draw(st.integers(0, 2)) < 2:
        model = draw(st.sampled_from(gold))
        source = model.get("arguments") or model.get("parameters") or {}
        source = json.loads(source) if isinstance(source, str) else source
        args = {k: draw(st.sampled_from(LOOKALIKES))(v) for k, v in source.items()}
        if args and draw(st.integers(0, 3)) == 3:  # a key left out
            args.pop(draw(st.sampled_from(sorted(args))))
        if draw(st.integers(0, 3)) == 3:  # a key added (or a value replaced)
            args[draw(st.sampled_from(KEYS))] = draw(VALUES)
        name = model["name"]
    else:
        args = draw(ARGS)
        name = draw(st.sampled_from([*NAMES, "h", "zz", "", 5]))
    form = draw(
        st.sampled_from(
            ["args"] * 10 + ["string", "null", "params", "empty+params", "falsy", "list", "text"]
        )
    )
    obj = {"name": name}
    if form == "args":
        obj["arguments"] = args
    elif form == "string":
        obj["arguments"] = json.dumps(args)
    elif form == "null":
        obj["arguments"] = None
    elif form == "params":
        obj["parameters"] = args
    elif form == "empty+params":
        obj["arguments"] = draw(st.sampled_from([{}, "", 0, False, []]))
        obj["parameters"] = draw(st.sampled_from([args, "x", [1]]))
    elif form == "falsy":
        obj["arguments"] = draw(st.sampled_from([{}, "", 0, False, []]))
    elif form == "list":
        obj["arguments"] = [1]
    else:
        obj["arguments"] = "not json"
    return obj


@st.composite
def block_content(draw, gold):
    """What goes between ``<tool_call>`` and ``</tool_call>``."""
    kind = draw(st.sampled_from(["object", "object", "object", "array", "junk"]))
    if kind == "object":
        body = json.dumps(draw(call_object(gold)))
    elif kind == "array":
        body = json.dumps(draw(st.lists(call_object(gold), max_size=3)))
    else:
        body = draw(st.sampled_from(["{bad", "", '"text"', "3", "[1]", "null", "[{}]", "{}"]))
    return draw(PADDING) + body + draw(PADDING)


@st.composite
def piece(draw, gold):
    kind = draw(st.sampled_from(["block"] * 6 + ["unclosed", "close", "think", "response", "text"]))
    if kind == "block":
        return "<tool_call>" + draw(block_content(gold)) + "</tool_call>"
    if kind == "unclosed":
        return "<tool_call>" + draw(block_content(gold))
    if kind == "close":
        return "</tool_call>"
    if kind == "think":
        inner = "<tool_call>" + draw(block_content(gold)) + "</tool_call>"
        opening = draw(st.sampled_from(["<think>", "<thinking>"]))
        closing = draw(st.sampled_from(["</think>", "</thinking>", ""]))
        return opening + "draft " + inner + closing
    if kind == "response":
        return "<tool_response>" + draw(st.sampled_from(["42", '{"ok": 1}'])) + "</tool_response>"
    return draw(st.sampled_from(["ok ", "\n", "The answer is 42."]))


BOOLISH = st.sampled_from(
    [True, False, 1, 0, 1.0, 0.0, "1", "0", "true", "false", " TRUE", "False ", "1.0", "0.0", "yes"]
)


def value_pairs():
    """Pairs of argument values: independent, a value and a look-alike, or two boolean-ish."""
    alike = VALUES.flatmap(
        lambda v: st.tuples(st.just(v), st.sampled_from(LOOKALIKES).map(lambda f: f(v)))
    )
    return st.one_of(st.tuples(VALUES, VALUES), alike, st.tuples(BOOLISH, BOOLISH))


@st.composite
def matching_cases(draw):
    """(response, ground truth) where several same-name calls compete for the gold calls."""
    small = st.dictionaries(st.sampled_from(KEYS), st.integers(0, 1), min_size=1, max_size=2)
    gold = [{"name": "f", "arguments": a} for a in draw(st.lists(small, min_size=2, max_size=3))]
    preds = [
        {"name": "f", "arguments": a}
        for a in draw(st.lists(st.one_of(small, st.just({})), min_size=1, max_size=3))
    ]
    layout = draw(st.sampled_from(["array", "tags"]))
    if layout == "array":
        text = "<tool_call>" + json.dumps(preds) + "</tool_call>"
    else:
        text = "".join("<tool_call>" + json.dumps(p) + "</tool_call>" for p in preds)
    return text, {"allowed_tools": ["f"], "gold_tool_calls": [gold]}


@st.composite
def cases(draw):
    """(response text, ground truth) pairs."""
    gt = draw(ground_truths())
    gold = _flat_gold(gt["gold_tool_calls"])
    text = "".join(draw(st.lists(piece(gold), min_size=1, max_size=4)))
    return text, gt
