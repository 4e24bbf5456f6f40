"""A labelled set of summaries for the rubric judge, built from the synthetic generator.

For each tool row of the synthetic world (its question, its gold calls' recorded responses, its
gold reply), a family of replies with what each truly states:

- ``gold``: the row's gold reply, which states every fact of its responses;
- ``says_nothing``: filler, lorem ipsum, tool-call markup (well formed, and cut short as a small
  policy writes it), the question echoed, the tool JSON pasted whole or quoted in a sentence.
  None is a summary: each states 0 facts, whatever text it copies;
- ``wrong_number``: the gold with one number replaced by a wrong one (one variant per number),
  and with every number wrong; ``other_row``: the gold reply of another row of the same tool;
- ``degraded``: the gold cut to its first half, reduced to its first sentence (two-call rows),
  said twice, or followed by a sentence with an invented number.

``facts_right`` of a prose reply is how many facts of the responses it states that the question
does not already state (the rubric's own reading of texts: rule 2's facts, rule 3's matching).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass

from slca_exp.core.rows import Row
from slca_exp.data.synthetic import build_rows
from slca_exp.judges import JudgeView
from slca_exp.judges.rubric import Statement, read_response, response_facts

FILLERS = (
    "I have looked into your request carefully and here is my answer for you.",
    "Sure! Let me know if there is anything else I can help you with today.",
    "Here is the information you asked for, based on the results of the tools above.",
    "I checked the tools and everything went fine. I hope this helps you!",
)
LOREM = "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor."
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


@dataclass(frozen=True)
class Labelled:
    """One reply of the set: its row, family, kind, what the judge sees, what it states."""

    row: int
    family: str
    kind: str
    view: JudgeView
    facts_right: int


def tool_rows(n: int, seed: int = 0) -> list[dict]:
    """The first ``n`` rows with tool calls of a synthetic validation split."""
    rows = [r for r in build_rows(2 * n + 8, "val", seed) if r["extra_info"]["reply"] and _steps(r)]
    assert len(rows) >= n, len(rows)
    return rows[:n]


def _steps(row: dict) -> list:
    return json.loads(row["reward_model"]["ground_truth"]["gold_tool_calls"])


def new_facts_stated(view: JudgeView) -> int:
    """How many facts of the responses (distinct, not stated by the question) the reply states."""
    question, reply = Statement(view.question), Statement(view.reply)
    facts = {f for r in view.tool_responses for f in response_facts(r) if not question.states(f)}
    return sum(reply.states(f) for f in facts)


def wrong(token: str, taken: set[tuple[int, str]], rng: random.Random) -> str:
    """A number written like ``token`` that no response or question number matches, above 10."""
    decimals = len(token) - token.index(".") - 1 if "." in token else 0
    value = float(token)
    while True:
        value = value * rng.uniform(1.3, 2.5) + rng.uniform(11.0, 97.0)
        text = f"{value:.{decimals}f}"
        if all(s != f"{float(text):.{d}f}" for d, s in taken):
            return text


def labelled_set(n_rows: int = 200, seed: int = 0) -> list[Labelled]:
    """The set over the first ``n_rows`` tool rows of seed ``seed`` (deterministic)."""
    rows = tool_rows(n_rows, seed)
    by_tool: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        by_tool.setdefault(_steps(row)[0][0]["name"], []).append(i)
    out: list[Labelled] = []
    for i, row in enumerate(rows):
        rng = random.Random(f"{seed}:{i}")
        question = Row(row).prompt()[-1]["content"]
        responses = tuple(r["content"] for r in json.loads(row["extra_info"]["tool_responses"]))
        gold = row["extra_info"]["reply"]
        calls = [c for step in _steps(row) for c in step]
        taken = set(Statement(question).forms)
        for r in responses:
            taken |= read_response(r)[1]

        replies: list[tuple[str, str, str, bool]] = []  # family, kind, reply, states facts

        def add(family: str, kind: str, reply: str, states: bool = True) -> None:
            replies.append((family, kind, reply, states))  # noqa: B023 - used within the row

        add("gold", "gold", gold)
        for n, filler in enumerate(FILLERS):
            add("says_nothing", f"filler_{n}", filler, states=False)
        add("says_nothing", "lorem", LOREM, states=False)
        markup = "\n".join(
            f"<tool_call>\n{json.dumps(c, separators=(',', ':'))}\n</tool_call>" for c in calls
        )
        add("says_nothing", "markup", markup, states=False)
        add("says_nothing", "markup_cut", markup.removeprefix("<tool_call>\n"), states=False)
        add("says_nothing", "echo", question, states=False)
        add("says_nothing", "echo_asked", f"You asked: {question}", states=False)
        add("says_nothing", "tool_json", "\n".join(responses), states=False)
        add("says_nothing", "tool_json_quoted", f"Here is the result: {responses[0]}", states=False)

        numbers = list(_NUMBER.finditer(gold))
        for m in numbers:
            if "." not in m.group() and float(m.group()) <= 10:
                continue  # rule 5 ignores integers 0..10: a changed one is no invented number
            reply = gold[: m.start()] + wrong(m.group(), taken, rng) + gold[m.end() :]
            add("wrong_number", f"one_wrong_{m.start()}", reply)
        if numbers:
            parts, end = [], 0
            for m in numbers:
                parts += [gold[end : m.start()], wrong(m.group(), taken, rng)]
                end = m.end()
            add("wrong_number", "all_wrong", "".join(parts) + gold[end:])
        peers = [j for j in by_tool[_steps(row)[0][0]["name"]] if j != i]
        if peers:
            add("other_row", "other_row", rows[rng.choice(peers)]["extra_info"]["reply"])

        words = gold.split()
        add("degraded", "first_half", " ".join(words[: len(words) // 2]))
        if len(calls) > 1:
            add("degraded", "first_sentence", gold.split(". ")[0] + ".")
        add("degraded", "said_twice", f"{gold} {gold}")
        extra = wrong("63.5", taken, rng)
        add("degraded", "invented_extra", f"{gold} The humidity is {extra} percent.")
        for family, kind, reply, states in replies:
            view = JudgeView(question, responses, reply)
            out.append(Labelled(i, family, kind, view, new_facts_stated(view) if states else 0))
    return out
