"""Rollout records: segments, turns, advantages and calls read exactly off the tokens and masks."""

import json
import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from slca_exp.estimators import EstimatorParams, RolloutScores, get_estimator
from slca_exp.estimators.segments import split_segments
from slca_exp.rollouts import RolloutRecord, build_record, due, pick
from slca_exp.rollouts.batch import BatchView, logged_rollouts, samples_within_groups
from slca_exp.rollouts.files import read_records, step_of, write_records
from tests.rollouts.samples import ANSWER, RUN, WordTokenizer, record, rewards, step_records


def _masks(draw_runs):
    """A response mask from alternating run lengths, starting with a generated run."""
    mask = []
    for k, length in enumerate(draw_runs):
        mask += [1 - k % 2] * length
    return mask


@settings(max_examples=150, deadline=None)
@given(
    runs=st.lists(st.integers(1, 6), min_size=1, max_size=7),
    seed=st.integers(0, 2**31 - 1),
    rule=st.sampled_from(["parity", "corrected"]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
)
def test_a_record_holds_every_token_with_its_exact_segment_and_advantage(runs, seed, rule, dtype):
    rng = random.Random(seed)
    mask = _masks(runs)
    n = len(mask)
    ids = [rng.randrange(50) for _ in range(n)]
    split = split_segments(torch.tensor([mask]))
    if rule == "corrected":
        split = split.without_summary(torch.tensor([True]))
    tool, summary = split.tool_mask[0].tolist(), split.summary_mask[0].tolist()
    adv = torch.tensor([rng.uniform(-3, 3) for _ in range(n)]).to(dtype)
    adv = torch.where(torch.tensor(mask).bool(), adv, torch.zeros((), dtype=dtype))
    rec = build_record(
        token_ids=ids,
        decode=lambda xs: "".join(f"<{x}>" for x in xs),
        response_mask=mask,
        tool_mask=tool,
        summary_mask=summary,
        advantages=adv.tolist(),
        logprobs=None,
        rewards=rewards(1.0),
        answers=None,
        run=RUN,
        step=3,
        split="train",
        group="train-0",
        sample=0,
        prompt=[],
        tools=[],
        gold=[],
        tool_adv=0.5,
        summary_adv=-0.5,
        ends_on_tool_call=False,
    )
    # every token, in order, with the segment the estimator's split gives it
    assert rec.token_ids == ids and len(rec.segments) == n
    for k in range(n):
        want = "e" if not mask[k] else "s" if summary[k] else "t" if tool[k] else "-"
        assert rec.segments[k] == want
        # the advantage the update used, bit for bit (bfloat16 values are exact in a float)
        assert rec.advantages[k] == (float(adv[k]) if mask[k] else None)
    assert rec.response == "".join(rec.token_text)
    # the turns partition the response: assistant turns are the generated runs
    assert [t.start for t in rec.turns][0] == 0 and rec.turns[-1].end == n
    assert all(a.end == b.start for a, b in zip(rec.turns, rec.turns[1:], strict=False))
    assert [t.tokens for t in rec.turns] == runs
    assert [t.role for t in rec.turns] == [
        "assistant" if k % 2 == 0 else "tool" for k in range(len(runs))
    ]
    # JSON and back: the same record
    again = RolloutRecord.from_dict(json.loads(rec.to_json()))
    assert again.to_dict() == rec.to_dict()


def test_calls_are_paired_with_the_answers_that_followed_them():
    rec = record()
    (call,) = rec.calls
    assert (call.turn, call.name, call.arguments) == (0, "get_weather", {"city": "Paris"})
    assert call.answer.content == ANSWER and call.answer.status == "ok"
    assert call.answer.cached is False
    assert rec.summary_text == "It is 21 degrees in Paris.<|im_end|>"


def test_without_the_engines_answers_the_tool_turn_gives_the_content():
    tok = WordTokenizer()
    base = record(tok=tok)
    mask = [0 if c == "e" else 1 for c in base.segments]
    rec = build_record(
        token_ids=base.token_ids,
        decode=tok.decode,
        response_mask=mask,
        tool_mask=[c == "t" for c in base.segments],
        summary_mask=[c == "s" for c in base.segments],
        advantages=None,
        logprobs=None,
        rewards=base.rewards,
        answers=None,
        run=RUN,
        step=0,
        split="val",
        group="val-0",
        sample=0,
        prompt=[],
        tools=[],
        gold=[],
        tool_adv=None,
        summary_adv=None,
        ends_on_tool_call=False,
    )
    assert rec.calls[0].answer.content == ANSWER and rec.calls[0].answer.status is None
    assert rec.advantages == [None] * len(base.token_ids)  # validation: no update, no advantage


def test_a_length_mismatch_or_an_unknown_split_is_refused():
    tok = WordTokenizer()
    kwargs = dict(
        token_ids=[0, 1],
        decode=tok.decode,
        response_mask=[1, 1],
        tool_mask=[False, False],
        summary_mask=[True, True],
        advantages=[0.0],
        logprobs=None,
        rewards=rewards(1.0),
        answers=None,
        run=RUN,
        step=0,
        split="train",
        group="g",
        sample=0,
        prompt=[],
        tools=[],
        gold=[],
        tool_adv=None,
        summary_adv=None,
        ends_on_tool_call=False,
    )
    tok.encode("a b")
    with pytest.raises(ValueError, match="advantages has 1 entries for 2 response tokens"):
        build_record(**kwargs)
    with pytest.raises(ValueError, match="split='test'"):
        build_record(**{**kwargs, "advantages": None, "split": "test"})


def test_the_records_file_reads_back_the_same_records(tmp_path):
    records = step_records()
    path = write_records(records, tmp_path / "step_000010.jsonl")
    assert [r.to_dict() for r in read_records(path)] == [r.to_dict() for r in records]
    assert step_of(path.name) == 10 and step_of("plots.png") is None
    (tmp_path / "bad.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(ValueError, match="bad.jsonl, line 1: not a rollout record"):
        list(read_records(tmp_path / "bad.jsonl"))
    # NaN totals (a failed judge) are written as null and read back as NaN
    assert math.isnan(records[3].rewards.total)
    assert math.isnan(list(read_records(path))[3].rewards.total)


def test_logged_steps_are_the_first_and_every_nth():
    assert [s for s in range(1, 31) if due(s, 10)] == [1, 10, 20, 30]
    assert not any(due(s, 0) for s in range(0, 50))  # every=0: nothing
    assert not due(0, 1)


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=6),
    per_step=st.integers(1, 12),
    seed=st.integers(0, 10**6),
)
def test_each_picked_group_shows_its_best_and_its_worst(sizes, per_step, seed):
    rng = random.Random(seed)
    groups = [g for g, size in enumerate(sizes) for _ in range(size)]
    rng.shuffle(groups)
    totals = [rng.choice([0.0, 0.5, 1.0, math.nan, rng.random()]) for _ in groups]
    chosen = pick(groups, totals, per_step)
    assert len(chosen) <= per_step and len({i for i, _ in chosen}) == len(chosen)

    def value(i):
        return -math.inf if math.isnan(totals[i]) else totals[i]

    order = list(dict.fromkeys(groups))  # groups in batch order
    shown = list(dict.fromkeys(groups[i] for i, _ in chosen))
    assert shown == order[: len(shown)]  # the first groups, none skipped
    for i, rank in chosen:
        members = [j for j, g in enumerate(groups) if g == groups[i]]
        if rank == "best":
            assert value(i) == max(value(j) for j in members)
        else:
            assert rank == "worst" and value(i) == min(value(j) for j in members)
    # as many as asked for, while groups with two or more rollouts are left
    possible = sum(min(2, size) for size in (groups.count(g) for g in order))
    assert len(chosen) == min(per_step, possible) or len(shown) == len(order)


def test_a_batch_view_gives_each_logged_rollout_its_estimators_advantages():
    """The view path both engines take: the record's advantages are the estimator's, exactly."""
    tok = WordTokenizer()
    base = [record(tok=tok, summary=s) for s in ("a b c<|im_end|>", "d<|im_end|>")] * 2
    ids = [r.token_ids for r in base]
    width = max(map(len, ids))
    mask = torch.zeros(4, width, dtype=torch.long)
    for i, r in enumerate(base):
        mask[i, : len(r.token_ids)] = torch.tensor([0 if c == "e" else 1 for c in r.segments])
    groups = [0, 0, 1, 1]
    scores = RolloutScores(
        tool=torch.tensor([0.2, 0.9, 0.4, 0.4]),
        summary=torch.tensor([1.0, 0.0, 0.5, 0.25]),
        total=torch.tensor([1.2, 0.9, 0.9, 0.65]),
    )
    adv = get_estimator("slca_grpo")(mask, groups, scores, EstimatorParams())
    split = split_segments(mask)
    row = {"prompt": [], "reward_model": {"ground_truth": "{}"}}
    view = BatchView(
        response_ids=ids,
        response_mask=mask,
        tool_mask=split.tool_mask,
        summary_mask=split.summary_mask,
        advantages=adv.advantages,
        logprobs=None,
        tool_adv=adv.tool_adv,
        summary_adv=adv.summary_adv,
        rows=[{**row, "extra_info": {"index": g}} for g in groups],
        groups=[f"train-{g}" for g in groups],
        samples=samples_within_groups(groups),
        rewards=[rewards(float(t)) for t in scores.total],
        answers=None,
        ends_on_tool_call=[False] * 4,
    )
    records = logged_rollouts(view, per_step=4, decode=tok.decode, run=RUN, step=5, split="train")
    assert [(r.group, r.sample, r.rank) for r in records] == [
        ("train-0", 0, "best"),
        ("train-0", 1, "worst"),
        ("train-1", 0, "best"),
        ("train-1", 1, "worst"),
    ]
    for r, i in zip(records, [0, 1, 2, 3], strict=True):
        n = len(ids[i])
        want = [
            float(a) if m else None for a, m in zip(adv.advantages[i, :n], mask[i, :n], strict=True)
        ]
        assert r.advantages == want
        assert r.tool_adv == float(adv.tool_adv[i]) and r.summary_adv == float(adv.summary_adv[i])
