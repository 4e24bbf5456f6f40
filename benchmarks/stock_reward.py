"""A plain verl reward function, for the stock arm of ``benchmarks/rollout_cost.py --verl``.

verl's ``naive`` reward manager calls ``compute_score`` once per finished rollout, as it does for
any rule-based reward (``reward.custom_reward_function``): 1.0 when the rollout's first tool
call names the tool of the row's first gold call, else 0.0. No slca-exp code is involved.
"""

import json
import re

_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """1.0 if the first call's name is the first gold call's, else 0.0."""
    found = _CALL.search(solution_str or "")
    if found is None:
        return 0.0
    try:
        name = json.loads(found.group(1)).get("name")
        gold = json.loads(ground_truth["gold_tool_calls"])[0][0]["name"]
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return 0.0
    return float(name == gold)
