"""Token drift: a rollout's ids against the chat template's rendering of its conversation.

Random conversations assembled the way both engines assemble them must match their rendering
exactly, and each kind of drift must be caught where it is; real rollouts of the tool caller
must carry none, and the same rollouts with the separator after each assistant turn dropped
(a glue that starts at ``<|im_start|>``) must be caught at every tool turn.
"""

import json
import random

import pytest
import torch

from slca_exp.backbones import load_backbone
from slca_exp.backbones.chat import IM_END, PAD, SPECIAL_TOKENS, TEXT_TOKENS, tool_turn_text
from slca_exp.config.schema import BackboneConfig
from slca_exp.core.rows import Row
from slca_exp.engines.local.rollout import RolloutSettings
from slca_exp.rollouts import Answer
from slca_exp.rollouts.drift import check_drift, mismatch_frac
from slca_exp.tracking.credit_view import render_credit_view
from slca_exp.tracking.rollout_traces import root_attributes
from tests.engines.tool_caller import roller_for
from tests.rollouts.drift import first_glue_position, record_of, without_token


@pytest.fixture(scope="module")
def backbone(tool_caller, tmp_path_factory):
    cfg = BackboneConfig(source="local", name="tool-caller", path=str(tool_caller.folder))
    root = tmp_path_factory.mktemp("drift")
    return load_backbone(cfg, corpus=None, cache_root=root, seed=0)


CALL = '<tool_call>\n{"name":"probe","arguments":{"x":1}}\n</tool_call>'


class Assembly:
    """A random conversation's response assembled token by token, as the engines do it.

    Each assistant turn is random ids (the policy's own tokens, not the tokenizer's split of
    their text), then as many calls as the tool turn after it answers, then its end-of-turn
    token; the last turn may be cut off by the budget (no end-of-turn token).
    """

    def __init__(self, tok, rng: random.Random, row: dict, *, duplicate=False, eos_turn=False):
        vocab = tok.get_vocab()
        special = {vocab[t] for t in (*SPECIAL_TOKENS, *TEXT_TOKENS) if t in vocab}
        plain = [i for i in range(len(vocab)) if i not in special]
        self.ids, self.mask, self.answers, self.glue = [], [], [], []
        turns = rng.randint(1, 3)
        for turn in range(turns):
            last = turn == turns - 1
            responses = (
                [] if last else [json.dumps({"v": rng.random()}) for _ in range(rng.randint(1, 2))]
            )
            generated = rng.choices(plain, k=rng.randint(1, 12))
            for _ in responses:
                generated += tok("\n" + CALL, add_special_tokens=False)["input_ids"]
            if not last or rng.random() < 0.7:
                generated.append(vocab[PAD] if eos_turn and not last else vocab[IM_END])
            self.ids += generated
            self.mask += [1] * len(generated)
            if last:
                break
            self.answers += [Answer(r, "ok") for r in responses]
            shown = responses + responses[:1] if duplicate else responses
            glue = tok(tool_turn_text(shown), add_special_tokens=False)["input_ids"]
            self.glue.append(len(self.ids))
            self.ids += glue
            self.mask += [0] * len(glue)
        view = Row(row)
        self.prompt, self.tools = view.prompt(), view.tools()

    def record(self, tok):
        return record_of(
            tok, self.ids, self.mask, prompt=self.prompt, tools=self.tools, answers=self.answers
        )


def assembled(tok, rows, seed: int, *, tool_turn: bool = False, **kinds) -> Assembly:
    """A random assembly (one with a tool turn when ``tool_turn``)."""
    rng = random.Random(seed)
    made = Assembly(tok, rng, rng.choice(rows), **kinds)
    while tool_turn and not made.glue:
        made = Assembly(tok, rng, rng.choice(rows), **kinds)
    return made


@pytest.mark.parametrize("seed", range(40))
def test_a_random_conversation_assembled_as_the_engines_do_is_its_rendering_exactly(
    backbone, tool_caller, seed
):
    tok = backbone.tokenizer
    made = assembled(tok, tool_caller.rows, seed)
    record = made.record(tok)
    assert sum(c.answer is not None for c in record.calls) == len(made.answers)
    drift = check_drift(record, tok)
    assert (drift.mismatched, drift.first, drift.marks) == (0, None, [])
    assert drift.tokens == len(made.ids)


@pytest.mark.parametrize("seed", range(40))
def test_a_dropped_glue_token_is_caught_exactly_where_it_was(backbone, tool_caller, seed):
    tok = backbone.tokenizer
    made = assembled(tok, tool_caller.rows, 1000 + seed, tool_turn=True)
    record = made.record(tok)
    rng = random.Random(seed)
    env = [i for i, c in enumerate(record.segments) if c == "e"]
    position = rng.choice(env)
    dropped = record.token_ids[position]
    shorter = without_token(tok, record, position)
    drift = check_drift(shorter, tok)
    assert drift.mismatched == 1
    # in a run of equal tokens the diff may place the gap at any of them
    start = position
    while start - 1 in env and record.token_ids[start - 1] == dropped:
        start -= 1
    assert start <= drift.first <= position, (drift, position)
    text = tok.decode([dropped], skip_special_tokens=False)
    assert drift.marks == [[drift.first, text]] and drift.expected.startswith(text)


@pytest.mark.parametrize("seed", range(10))
def test_a_tool_response_injected_twice_is_caught_in_the_tool_turn(backbone, tool_caller, seed):
    tok = backbone.tokenizer
    made = assembled(tok, tool_caller.rows, 2000 + seed, tool_turn=True, duplicate=True)
    drift = check_drift(made.record(tok), tok)
    assert drift.mismatched > 0 and drift.where == "tool turn"
    assert drift.first > made.glue[0]


@pytest.mark.parametrize("seed", range(10))
def test_a_turn_closed_by_another_token_than_the_templates_is_caught_there(
    backbone, tool_caller, seed
):
    """``<|endoftext|>``: a checkpoint's generation config may declare it a stop token."""
    tok = backbone.tokenizer
    made = assembled(tok, tool_caller.rows, 3000 + seed, tool_turn=True, eos_turn=True)
    drift = check_drift(made.record(tok), tok)
    # the template closes each such turn's text (ending in <|endoftext|>) with <|im_end|>
    assert (drift.mismatched, drift.first) == (len(made.glue), made.glue[0])
    assert drift.where == "assistant turn" and drift.expected.startswith(IM_END + "\n")
    assert drift.marks == [[start, IM_END] for start in made.glue]


@pytest.fixture(scope="module")
def real(backbone, tool_caller):
    """The tool caller's rollouts as the local engine makes them, and with the separator dropped."""
    tok = backbone.tokenizer
    out = {}
    for name, glue in (("real", tool_turn_text), ("dropped", lambda rs: tool_turn_text(rs)[1:])):
        roller = roller_for(backbone)
        roller.tool_turn_text = glue
        torch.manual_seed(0)
        rolls = roller.run(tool_caller.rows[:8], 4, RolloutSettings(2, 48, 160))
        out[name] = [
            record_of(
                tok,
                rolls.response_ids[i],
                rolls.response_mask[i],
                prompt=Row(rolls.rows[i]).prompt(),
                tools=Row(rolls.rows[i]).tools(),
                answers=[Answer(a.content, a.status) for a in rolls.answers[i]],
                sample=i,
            )
            for i in range(len(rolls))
        ]
    return out


def test_the_local_engines_rollouts_carry_no_drift(backbone, real):
    drifts = [check_drift(r, backbone.tokenizer) for r in real["real"]]
    assert sum(first_glue_position(r) is not None for r in real["real"]) >= 2  # tool turns
    assert mismatch_frac(drifts) == 0.0
    assert all(d.first is None for d in drifts)


def test_a_dropped_separator_is_caught_at_every_tool_turn_and_shown(backbone, real):
    tok = backbone.tokenizer
    caught = 0
    for record in real["dropped"]:
        drift = check_drift(record, tok)
        tool_turns = [t for t in record.turns if t.role == "tool"]
        assert drift.mismatched == len(tool_turns)
        if not tool_turns:
            continue
        caught += 1
        assert drift.first == tool_turns[0].start
        assert drift.where == "tool turn"
        assert drift.expected == "\n" + drift.found[: len(drift.expected) - 1]
        assert [m[0] for m in drift.marks] == [t.start for t in tool_turns]
        record.drift = drift
        attributes = root_attributes(record)
        assert attributes["slca.drift.first"] == tool_turns[0].start
        assert attributes["slca.drift.tokens"] == len(tool_turns)
        page = render_credit_view([record], title="drift")
        assert page.count(' drift"') == len(tool_turns)
        assert "differ from the chat template&#x27;s rendering" in page
    assert caught >= 2
    assert mismatch_frac([check_drift(r, tok) for r in real["dropped"]]) > 0


def test_dropping_a_separator_from_a_real_rollout_is_the_same_drift(backbone, real):
    tok = backbone.tokenizer
    for record in real["real"]:
        position = first_glue_position(record)
        if position is None:
            continue
        drift = check_drift(without_token(tok, record, position), tok)
        assert drift.first == position and drift.expected.startswith("\n")


def test_the_rollouts_command_names_the_drift_of_a_rollout_that_has_one(backbone, real):
    from slca_exp.tracking.rollout_text import Palette, render

    tok = backbone.tokenizer
    clean = real["real"][0]
    clean.drift = check_drift(clean, tok)
    assert "drift" not in render(clean, Palette(False))
    record = next(r for r in real["dropped"] if first_glue_position(r) is not None)
    record.drift = check_drift(record, tok)
    text = render(record, Palette(False))
    line = next(x for x in text.splitlines() if x.startswith("drift"))
    assert f"first at token {first_glue_position(record)} (tool turn): template '\\n" in line
