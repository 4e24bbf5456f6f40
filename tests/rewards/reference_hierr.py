"""An independent scorer of the public HierR tool process reward ("v8.2"), for differential tests.

Written straight from the public reward's observable behaviour, separately from
``slca_exp.rewards``: regular expressions instead of our linear scanner, plain dicts instead of
``Gold`` and ``ToolCall``, the gold normalised the lenient public way. Slow and simple on purpose;
it only has to be obviously right on small inputs.

Behaviour, in order:

1. ground truth: ``allowed_tools`` empty or missing -> score 0, every component 0, no penalty;
2. think blocks: ``<think>`` or ``<thinking>`` up to the first ``</think>`` or ``</thinking>``,
   removed (non-greedy, left to right);
3. gold: a JSON string is decoded; nested (the first item is a list): each list item is a step,
   names become ``{"name": n}``, dict items stay, other items and empty steps are dropped; flat:
   names and dicts kept as one step;
4. tags: #open and #close ``<tool_call>`` tags; no open tag while gold has a call -> the penalty;
5. blocks: non-greedy ``<tool_call>(.*?)</tool_call>``; content trimmed (``str.strip``) and
   JSON-decoded; an object or a list of objects, each with a non-empty string name in the
   allowed tools and ``arguments or parameters or {}`` that is a dict; else the block is dropped;
6. format = valid blocks / max(open, close); name = multiset F1;
7. key / value over gold dicts whose ``arguments`` (a dict, or a JSON string of one) are not
   empty; greedy in gold order over unused same-name predictions, taking one only when
   key + value beats the best so far (starting at 0);
8. parallel: len(first gold step) == len(first valid block) (0 when absent).
"""

import json
import re
from collections import Counter

THINK = re.compile(r"<think(?:ing)?>.*?</think(?:ing)?>", re.DOTALL)
CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
WEIGHTS = {"format": 0.10, "name": 0.25, "key": 0.15, "value": 0.20, "parallel": 0.30}
PENALTY = -0.5
TRUTH = {"true": True, "false": False, "1": True, "0": False}


def same_value(a, b):
    """The public loose equality (symmetric)."""
    if a is None or b is None:
        return a is None and b is None
    ta, tb = str(a).strip().lower(), str(b).strip().lower()
    if ta == tb:
        return True
    try:
        if abs(float(a) - float(b)) < 1e-9:
            return True
    except (TypeError, ValueError):
        pass
    if ta in TRUTH and tb in TRUTH:
        return TRUTH[ta] == TRUTH[tb]
    if isinstance(a, (list, dict)) and isinstance(b, (list, dict)):
        try:
            return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
        except (TypeError, ValueError):
            return False
    return False


def gold_steps(raw):
    """(steps, flat) of the gold calls, each call a dict with at least ``name``."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return [], []
    if not raw or not isinstance(raw, list):
        return [], []

    def as_call(item):
        if isinstance(item, str):
            return {"name": item}
        return item if isinstance(item, dict) and item else None

    if isinstance(raw[0], list):
        steps = []
        for step in raw:
            if isinstance(step, list):
                calls = [c for c in map(as_call, step) if c is not None]
                if calls:
                    steps.append(calls)
        return steps, [c for step in steps for c in step]
    flat = [{"name": i} if isinstance(i, str) else i for i in raw if isinstance(i, (str, dict))]
    return ([flat] if flat else []), flat


def gold_arguments(call):
    args = call.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return {}
    return args if isinstance(args, dict) else {}


def valid_blocks(text, allowed):
    """The calls ``(name, arguments)`` of each valid block, in order."""
    out = []
    for content in CALL.findall(text):
        content = content.strip()
        if not content:
            continue
        try:
            parsed = json.loads(content)
        except ValueError:
            continue
        if isinstance(parsed, dict):
            parsed = [parsed]
        if not isinstance(parsed, list):
            continue
        calls = []
        for obj in parsed:
            if not isinstance(obj, dict):
                break
            name = obj.get("name")
            if not isinstance(name, str) or not name or name not in allowed:
                break
            args = obj.get("arguments") or obj.get("parameters") or {}
            if not isinstance(args, dict):
                break
            calls.append((name, args))
        else:
            out.append(calls)
    return out


def key_and_value(gold_args, pred_args):
    gold_keys, pred_keys = set(gold_args), set(pred_args)
    key = len(gold_keys & pred_keys) / len(gold_keys | pred_keys) if pred_keys else 0.0
    shared = gold_keys & pred_keys
    agree = sum(same_value(pred_args[k], gold_args[k]) for k in shared)
    return key, (agree / len(gold_keys) if shared else 0.0)


def score(text, ground_truth, weights=WEIGHTS, penalty=PENALTY):
    """(score, components, should_no_call) the public reward gives ``text``."""
    zero = dict.fromkeys(WEIGHTS, 0.0)
    allowed = ground_truth.get("allowed_tools") or []
    if not allowed:
        return 0.0, zero, 0
    allowed = {str(t) for t in allowed}
    steps, flat = gold_steps(ground_truth.get("gold_tool_calls") or [])
    text = THINK.sub("", text)
    opened, closed = text.count("<tool_call>"), text.count("</tool_call>")
    if flat and opened == 0:
        return penalty, zero, 1
    blocks = valid_blocks(text, allowed)
    preds = [c for block in blocks for c in block]
    denom = max(opened, closed)
    comps = {"format": len(blocks) / denom if denom else 0.0}

    pred_names = [n for n, _ in preds]
    gold_names = [g.get("name", "") for g in flat]
    if not pred_names and not gold_names:
        comps["name"] = 1.0
    elif not pred_names or not gold_names:
        comps["name"] = 0.0
    else:
        common = sum((Counter(pred_names) & Counter(gold_names)).values())
        comps["name"] = 2.0 * common / (len(pred_names) + len(gold_names))

    argued = [(g.get("name", ""), gold_arguments(g)) for g in flat if gold_arguments(g)]
    if not argued:
        comps["key"], comps["value"] = 1.0, 1.0
    elif not preds:
        comps["key"], comps["value"] = 0.0, 0.0
    else:
        taken, keys, values = set(), 0.0, 0.0
        for name, args in argued:
            best, best_at = (0.0, 0.0), None
            for i, (pred_name, pred_args) in enumerate(preds):
                if i in taken or pred_name != name:
                    continue
                kv = key_and_value(args, pred_args)
                if kv[0] + kv[1] > best[0] + best[1]:
                    best, best_at = kv, i
            if best_at is not None:
                taken.add(best_at)
            keys += best[0]
            values += best[1]
        comps["key"], comps["value"] = keys / len(argued), values / len(argued)

    first_gold = len(steps[0]) if steps else 0
    first_pred = len(blocks[0]) if blocks else 0
    comps["parallel"] = 1.0 if first_gold == first_pred else 0.0
    total = sum(weights[k] * comps[k] for k in WEIGHTS)
    return total, comps, 0
