"""``judge.noise``: perturbed ratings that a rerun reproduces, with the judge's own kept beside."""

import math
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slca_exp.config.services import JudgeConfig, JudgeNoiseConfig
from slca_exp.judges import JudgeRequest, JudgeResult, NoisyJudge, build_judge, describe_judge
from slca_exp.judges.noise import perturbed_rating
from slca_exp.rewards.summary import from_judge, judge_stats
from tests.judges.rows import FAITHFUL, rollout
from tests.judges.test_llm_judge_on_cpu import config, requests


class FixedJudge:
    """Rates every request ``rating`` (or short-circuits / fails the ones it is told to)."""

    name = "fixed"

    def __init__(self, rating=3, outcomes=None):
        self.rating, self.outcomes, self.calls = rating, outcomes or {}, 0

    def score(self, batch):
        self.calls += 1
        return [self.outcomes.get(r.response_text, JudgeResult.rated(self.rating)) for r in batch]

    async def ascore(self, batch):
        return self.score(batch)

    def describe(self):
        return {"backend": "fixed"}

    def stats(self):
        return {}

    def close(self):
        pass


def noisy(kind, level, seed=0, rating=3):
    noise = JudgeNoiseConfig(kind=kind, std=level, p=level)
    return NoisyJudge(FixedJudge(rating), noise, seed)


def batch(texts):
    return [JudgeRequest("q?", t) for t in texts]


texts = st.lists(st.text(min_size=1, max_size=40), min_size=1, max_size=30, unique=True)


@settings(max_examples=60, deadline=None)
@given(texts=texts, seed=st.integers(0, 2**31), kind=st.sampled_from(["gaussian", "flip"]))
def test_a_rerun_gives_identical_ratings(texts, seed, kind):
    level = 1.5 if kind == "gaussian" else 0.5
    first = noisy(kind, level, seed).score(batch(texts))
    again = noisy(kind, level, seed).score(batch(texts))  # a new judge: nothing carried over
    assert first == again
    assert all(r.raw_rating == 3 and 1 <= r.rating <= 5 for r in first)
    assert all(r.score == (r.rating - 1) / 4 for r in first)


@settings(max_examples=40, deadline=None)
@given(texts=texts, seed=st.integers(0, 2**31))
def test_zero_noise_changes_no_rating(texts, seed):
    for kind in ("gaussian", "flip"):
        results = noisy(kind, 0.0, seed).score(batch(texts))
        assert [r.rating for r in results] == [3] * len(texts)


@settings(max_examples=40, deadline=None)
@given(texts=texts, seed=st.integers(0, 2**31))
def test_a_rating_flipped_at_half_is_flipped_the_same_at_one(texts, seed):
    half = noisy("flip", 0.5, seed).score(batch(texts))
    full = noisy("flip", 1.0, seed).score(batch(texts))
    for h, f in zip(half, full, strict=True):
        if h.rating != 3:  # replaced at p=0.5: the same draw replaces it at p=1
            assert f.rating == h.rating


def test_flip_at_one_draws_every_rating_uniformly_and_the_seed_matters():
    texts = [f"rollout {i}" for i in range(5000)]
    results = noisy("flip", 1.0, seed=7).score(batch(texts))
    counts = Counter(r.rating for r in results)
    assert sorted(counts) == [1, 2, 3, 4, 5]
    # binomial(5000, 0.2): sd 28.3 around 1000; 4.5 sd either side
    assert all(873 <= c <= 1127 for c in counts.values()), counts
    other = noisy("flip", 1.0, seed=8).score(batch(texts))
    assert sum(a.rating != b.rating for a, b in zip(results, other, strict=True)) > 3000


def test_gaussian_noise_rounds_half_up_and_clips_to_the_scale():
    class Always:  # a stand-in generator whose gauss() is fixed
        def __init__(self, z):
            self.z = z

        def gauss(self, mu, sigma):
            return self.z

    assert perturbed_rating(3, "gaussian", 1.0, Always(0.5)) == 4  # 3.5 rounds up
    assert perturbed_rating(3, "gaussian", 1.0, Always(-0.5)) == 3  # 2.5 rounds up
    assert perturbed_rating(5, "gaussian", 2.0, Always(3.0)) == 5
    assert perturbed_rating(1, "gaussian", 2.0, Always(-3.0)) == 1
    spread = [perturbed_rating(3, "gaussian", 1.0, random.Random(s)) for s in range(2000)]
    assert set(spread) == {1, 2, 3, 4, 5}


def test_short_circuits_and_failures_pass_through():
    short, failed = JudgeResult.short_circuit("no tool response"), JudgeResult.failed("timeout")
    inner = FixedJudge(outcomes={"s": short, "f": failed})
    judge = NoisyJudge(inner, JudgeNoiseConfig(kind="flip", p=1.0), 0)
    got = judge.score(batch(["s", "f"]))
    assert got[0] == short and got[1].status == "failed" and math.isnan(got[1].score)


def test_raw_and_perturbed_ratings_reach_the_batch_metrics():
    texts = [f"r{i}" for i in range(200)]
    summaries = [from_judge(r) for r in noisy("flip", 1.0, rating=5).score(batch(texts))]
    stats = judge_stats(summaries)
    assert stats["judge/raw_rating"] == 5.0
    assert stats["judge/rating"] == sum(s.rating for s in summaries) / 200 < 5.0
    assert stats["judge/perturbed_frac"] == sum(s.rating != 5 for s in summaries) / 200 > 0.5


def test_the_cache_keeps_the_judges_raw_ratings(server, tmp_path):
    noise = JudgeNoiseConfig(kind="flip", p=1.0)
    replies = [f"{FAITHFUL} ({i})" for i in range(12)]
    with build_judge(config(server, tmp_path, noise=noise), seed=3) as judge:
        first = judge.score(requests(*replies))
    with build_judge(config(server, tmp_path, noise=noise), seed=3) as judge:
        rerun = judge.score(requests(*replies))
    with build_judge(config(server, tmp_path)) as plain:  # the same cache, without noise
        raw = plain.score(requests(*replies))
    assert len(server.completions) == 12  # the rerun and the plain judge asked nothing
    assert all(r.cached for r in rerun + raw)
    assert [r.rating for r in rerun] == [r.rating for r in first]
    assert [r.raw_rating for r in first] == [r.rating for r in raw] == [4] * 12
    assert any(r.rating != 4 for r in first)


def test_noise_is_recorded_in_the_judge_only_when_on():
    plain = describe_judge(JudgeConfig())
    assert "noise" not in plain  # recipes without noise keep their fingerprints
    on = describe_judge(JudgeConfig(noise=JudgeNoiseConfig(kind="gaussian", std=0.7)))
    assert on == {**plain, "noise": {"kind": "gaussian", "seed": None, "std": 0.7}}
    judge = build_judge(JudgeConfig(noise=JudgeNoiseConfig(kind="flip", p=0.25)), seed=1)
    assert judge.describe()["noise"] == {"kind": "flip", "seed": None, "p": 0.25}


def test_the_runs_seed_seeds_the_draws_unless_noise_seed_is_set():
    texts = batch([rollout(f"reply number {i}") for i in range(50)])

    def ratings(seed, noise_seed=None):
        noise = JudgeNoiseConfig(kind="flip", p=1.0, seed=noise_seed)
        judge = build_judge(JudgeConfig(min_reply_chars=0, noise=noise), seed=seed)
        return [r.rating for r in judge.score(texts)]

    assert ratings(1) != ratings(2)
    assert ratings(1, noise_seed=9) == ratings(2, noise_seed=9) == ratings(9)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("judge.noise.kind=uniform", "judge.noise.kind: must be one of none, gaussian, flip"),
        ("judge.noise.p=1.5", "judge.noise.p: must be <= 1 (got 1.5)"),
        ("judge.noise.std=-1", "judge.noise.std: must be >= 0 (got -1)"),
    ],
)
def test_bad_noise_settings_are_refused_with_the_key(override, message):
    from slca_exp.preflight import preflight

    checked = preflight([override])
    assert any(message in str(p) for p in checked.problems), checked.problems


def test_the_judges_reason_stands_unless_noise_changed_the_rating():
    said = JudgeResult.rated(1, reason="very poor: not a summary (tool-call markup)")
    outcomes = {f"reply {i}": said for i in range(40)}
    judge = NoisyJudge(FixedJudge(1, outcomes), JudgeNoiseConfig(kind="flip", p=0.5), 0)
    results = judge.score(batch(list(outcomes)))
    kept = [r for r in results if r.rating == 1]
    moved = [r for r in results if r.rating != 1]
    assert kept and moved  # 40 draws at p=0.5 (4/5 of replacements change a 1)
    assert {r.reason for r in kept} == {said.reason}
    assert all(r.raw_rating == 1 for r in results)
    assert {r.reason.split(" (", 1)[1] for r in moved} == {
        "judge: very poor: not a summary (tool-call markup); judge.noise=flip)"
    }
