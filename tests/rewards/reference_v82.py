"""An independent model of the public v8.2 reward's summary side, for differential tests.

The public SLCA-GRPO repository at commit 68539c5 ships two HierR rewards: the main method's
(``rl/slca_grpo/reward_fn.py``) and its predecessor "v8.2"
(``analysis/hierr_sweep/reward_fn_hierr_v82.py``, byte-identical to ``ablations/``'s), which its
four ablation launchers and its HierR sweep run with. Their tool process scores are the same
rules (``reference_hierr.score`` models both); they differ in what the summary judge is asked.
This module is written from v8.2's observable behaviour alone, with regular expressions and
``str.format`` where the package uses linear scans and its template files:

1. the judge is not asked when the row allows no tools (score 0), or on the no-call penalty
   (gold has a call, no ``<tool_call>`` tag once think blocks are removed: score -0.5);
2. the final response: think blocks removed; the text after the last ``</tool_response>``,
   stripped, if not empty; else, if there is a ``</tool_call>``, the text after the last one,
   stripped, unless it holds ``<tool_response>`` or starts with ``<tool_call>`` (then empty);
   else the text with its ``<tool_call>`` blocks removed, stripped;
3. a final response shorter than 10 characters scores 0 without asking; v8.2 has no other rule
   (the main reward also scores 0, first, when there is no ``<tool_response>`` block);
4. the judge is shown the question (``question_content``), the interactions (every
   ``<tool_call>`` content of the raw text, stripped and numbered ``[Tool Call i]``, then every
   ``<tool_response>`` content as ``[Tool Response i]``, entries one blank line apart) and the
   final response, in :data:`TEMPLATE`, as one user message;
5. the answer's first ``<response_quality>...<rating>X</rating>...</response_quality>`` (case
   and newlines ignored) gives the rating when ``X`` stripped and lower-cased is one of the five
   labels; the score is (rating - 1) / 4, and 0.0 when the judge failed or gave no such rating;
6. score = w_process * process + w_respq * summary (1 and 1 by default).

verl hands the reward a response decoded with special tokens skipped (:func:`decoded`): the
functions below take such a text.
"""

import re

from . import reference_hierr

TEMPLATE = """## Task
Evaluate the quality of an AI assistant's final response after using tools to help the user.

## Assessment Criteria
### Response Quality (1-5 scale)
- 1 (very poor): Response is completely wrong, irrelevant, or ignores tool results
- 2 (poor): Seriously misinterprets tool results or misses critical information
- 3 (acceptable): Basically correct but has minor errors or incomplete coverage
- 4 (good): Correctly uses tool results, response is clear and complete
- 5 (excellent): Perfect interpretation of results, professional and helpful response

## User Question
```
{question_content}
```

## Tool Interactions
```
{tool_interactions}
```

## Model's Final Response
```
{final_response}
```

## Evaluation Points
1. **Result Interpretation**: Does the model correctly understand and explain the data returned by tools?
2. **Information Completeness**: Does the response address all parts of the user's question?
3. **Expression Quality**: Is the response clear, well-organized, and helpful to the user?

## Output Format
<response>
  <response_quality>
    <reasoning>Brief analysis of the response quality based on the three evaluation points above.</reasoning>
    <rating><!-- one of: very poor, poor, acceptable, good, excellent --></rating>
  </response_quality>
</response>
"""  # noqa: E501 - the public prompt, line for line
"""v8.2's judge prompt (``LLM_JUDGE_PROMPT_TEMPLATE`` of the v8.2 file), for ``str.format``."""

THINK = re.compile(r"<think(?:ing)?>.*?</think(?:ing)?>", re.DOTALL)
CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
RESPONSE = re.compile(r"<tool_response>(.*?)</tool_response>", re.DOTALL)
RATING = re.compile(
    r"<response_quality>.*?<rating>(.*?)</rating>.*?</response_quality>", re.DOTALL | re.I
)
LABELS = {"very poor": 1, "poor": 2, "acceptable": 3, "good": 4, "excellent": 5}


def decoded(text):
    """A rollout decoded as verl decodes it for the reward: Qwen's chat control tokens left out."""
    return re.sub(r"<\|im_start\|>|<\|im_end\|>|<\|endoftext\|>", "", text)


def final_response(text):
    """Rule 2."""
    text = THINK.sub("", text)
    after = text.split("</tool_response>")[-1].strip() if "</tool_response>" in text else ""
    if after:
        return after
    if "</tool_call>" in text:
        after = text.split("</tool_call>")[-1].strip()
        if "<tool_response>" in after or not after or after.startswith("<tool_call>"):
            return ""
        return after
    return CALL.sub("", text).strip()


def tool_interactions(text):
    """Rule 4's interactions."""
    lines = []
    for i, content in enumerate(CALL.findall(text), 1):
        lines += [f"[Tool Call {i}]", content.strip(), ""]
    for i, content in enumerate(RESPONSE.findall(text), 1):
        lines += [f"[Tool Response {i}]", content.strip(), ""]
    return "\n".join(lines).strip()


def asks(text, ground_truth, *, main=False):
    """Whether the judge is asked (rules 1 and 3); ``main``: the main reward's rules instead."""
    if not ground_truth.get("allowed_tools"):
        return False
    _, flat = reference_hierr.gold_steps(ground_truth.get("gold_tool_calls") or [])
    if flat and "<tool_call>" not in THINK.sub("", text):
        return False
    if main and not RESPONSE.findall(text):
        return False
    return len(final_response(text)) >= 10


def request_text(text, ground_truth):
    """The one user message v8.2 sends about ``text`` (rule 4)."""
    return TEMPLATE.format(
        question_content=ground_truth.get("question_content", ""),
        tool_interactions=tool_interactions(text),
        final_response=final_response(text),
    )


def rating(answer):
    """Rule 5: the rating (1-5) v8.2 reads in the judge's answer, or ``None``."""
    found = RATING.search(answer) if answer is not None else None
    return LABELS.get(found.group(1).strip().lower()) if found else None


def summary_score(answer):
    """Rule 5: the summary score of the judge's answer (``None``: the request failed)."""
    read = rating(answer)
    return (read - 1) / 4.0 if read is not None else 0.0


def score(text, ground_truth, answer, weights=reference_hierr.WEIGHTS):
    """(score, process_score, summary_score) v8.2 gives ``text`` when its judge answers ``answer``.

    The process score it logs is the weighted sum with the run's weights (0 on the penalty).
    """
    total, components, no_call = reference_hierr.score(text, ground_truth, weights)
    if no_call or not ground_truth.get("allowed_tools"):
        return total, 0.0, 0.0
    summary = summary_score(answer) if asks(text, ground_truth) else 0.0
    return total + summary, total, summary
