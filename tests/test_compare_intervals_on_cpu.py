"""``compare``'s interval estimates, equivalence test and variance split, each against an
independent computation on fixed data: a hand computation, the exact bootstrap distribution
(every resample enumerated), statsmodels' TOST, or a simulation."""

import itertools
import math
import random
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient
from statsmodels.stats.weightstats import ttost_ind, ttost_paired

from slca_exp.analysis import intervals
from slca_exp.analysis.differences import Effect, compare_sides, verdict
from slca_exp.analysis.estimates import paired
from slca_exp.analysis.plots import profile
from slca_exp.analysis.variance import split_of
from slca_exp.commands.compare import main as compare_main
from slca_exp.rollouts.files import artifact_path, write_records
from tests.rollouts.samples import record


def test_the_iqm_is_the_mean_of_the_middle_half():
    # 5 runs: the lowest and the highest cut; 8 runs: two from each end. The hand sums are
    # added in another order than numpy's, so equal up to one rounding (rel 1e-12).
    five = [0.9, 0.1, 0.4, 0.2, 0.3]
    assert math.isclose(intervals.iqm(five), (0.2 + 0.3 + 0.4) / 3, rel_tol=1e-12)
    eight = [5.0, 1.0, 7.0, 3.0, 100.0, -50.0, 4.0, 6.0]
    assert math.isclose(intervals.iqm(eight), (3.0 + 4.0 + 5.0 + 6.0) / 4, rel_tol=1e-12)


def test_the_probability_of_improvement_counts_every_pair_and_half_the_ties():
    # b=2 beats 1, ties 2, loses to 3: 1.5 (twice); b=4 beats all three: 3; over 9 pairs
    assert intervals.probability_of_improvement([1, 2, 3], [2, 2, 4]) == 6 / 9
    assert intervals.probability_of_improvement([1, 2], [3, 4]) == 1.0
    assert intervals.probability_of_improvement([3, 4], [1, 2]) == 0.0


def _exact_quantiles(values, probabilities):
    """Quantiles of an exact bootstrap distribution (every resample equally likely)."""
    ordered = np.sort(np.asarray(values))
    return [ordered[min(len(ordered) - 1, int(p * len(ordered)))] for p in probabilities]


def _between(interval, exact):
    """The Monte Carlo percentile ends lie within the exact distribution's 1.5%-3.5% and
    96.5%-98.5% quantiles: with 10,000 resamples a 2.5% quantile's probability has a standard
    error of sqrt(0.025 * 0.975 / 10000) = 0.0016, so +/-0.01 is more than 6 of them."""
    lo_lo, lo_hi, hi_lo, hi_hi = _exact_quantiles(exact, [0.015, 0.035, 0.965, 0.985])
    return lo_lo <= interval.low <= lo_hi and hi_lo <= interval.high <= hi_hi


@pytest.mark.parametrize("statistic", ["mean", "iqm"])
def test_a_levels_interval_is_the_exact_bootstraps_percentiles(statistic):
    x = [0.31, 0.35, 0.52, 0.40, 0.47]
    f = {"mean": np.mean, "iqm": intervals.iqm}[statistic]
    exact = [f([x[i] for i in idx]) for idx in itertools.product(range(5), repeat=5)]
    got = intervals.level_intervals(x, x, paired=True)
    interval = got.mean_a if statistic == "mean" else got.iqm_a
    assert interval.point == pytest.approx(f(x), rel=1e-12)
    assert _between(interval, exact), (interval, _exact_quantiles(exact, [0.025, 0.975]))


def test_paired_differences_are_resampled_by_seed_and_unpaired_levels_each_on_their_own():
    a = [0.40, 0.45, 0.38, 0.50]
    b = [0.46, 0.44, 0.45, 0.58]
    d = [y - x for x, y in zip(a, b, strict=True)]
    idx4 = list(itertools.product(range(4), repeat=4))
    got = intervals.level_intervals(a, b, paired=True)
    assert _between(got.mean_diff, [np.mean([d[i] for i in idx]) for idx in idx4])
    # P(b > a), paired: the pairs resampled together
    exact_poi = [
        intervals.probability_of_improvement([a[i] for i in idx], [b[i] for i in idx])
        for idx in idx4
    ]
    # by hand: 0.46 beats 3 of a, 0.44 beats 2, 0.45 beats 2 and ties 0.45, 0.58 beats 4
    assert got.poi.point == intervals.probability_of_improvement(a, b) == 11.5 / 16
    assert _between(got.poi, exact_poi)
    # unpaired: a's runs and b's runs resampled independently (stratified by level)
    a3, b3 = a[:3], b[:3]
    idx3 = list(itertools.product(range(3), repeat=3))
    unpaired = intervals.level_intervals(a3, b3, paired=False)
    exact = [
        np.mean([b3[j] for j in jb]) - np.mean([a3[i] for i in ia])
        for ia in idx3
        for jb in idx3
    ]
    assert _between(unpaired.mean_diff, exact)
    exact_poi = [
        intervals.probability_of_improvement([a3[i] for i in ia], [b3[j] for j in jb])
        for ia in idx3
        for jb in idx3
    ]
    assert _between(unpaired.poi, exact_poi)


@pytest.mark.parametrize("margin", [0.02, 0.05, 0.2])
def test_tost_is_statsmodels_tost(margin):
    rng = random.Random(3)
    for _ in range(20):
        a = [rng.uniform(0.3, 0.6) for _ in range(6)]
        b = [x + rng.gauss(0.01, 0.03) for x in a]
        ours = intervals.tost(a, b, margin, paired=True)
        theirs = ttost_paired(np.array(b), np.array(a), -margin, margin)[0]
        assert ours.p == pytest.approx(float(theirs), rel=1e-9, abs=1e-15)  # same formulas
        welch = intervals.tost(a, b[:5], margin, paired=False)
        theirs = ttost_ind(np.array(b[:5]), np.array(a), -margin, margin, usevar="unequal")[0]
        assert welch.p == pytest.approx(float(theirs), rel=1e-9, abs=1e-15)
        # equivalent exactly when the 90% interval lies inside the margin
        assert ours.equivalent == (-margin < ours.low and ours.high < margin)


def test_the_seeds_to_show_equivalence_reach_the_power_in_simulation():
    """At the n it gives, TOST shows equivalence in at least 80% of simulated studies (minus 2
    standard errors of 4000 simulations, 0.013), at one fewer seed in less."""
    difference, sd, margin = 0.01, 0.04, 0.05
    n = intervals.seeds_to_show_equivalence(difference, sd, margin, paired=True)
    assert n is not None and n > 2
    rng = np.random.default_rng(7)

    def power(seeds):
        wins = 0
        for _ in range(4000):
            d = rng.normal(difference, sd, seeds)
            wins += intervals.tost(np.zeros(seeds), d, margin, paired=True).equivalent
        return wins / 4000

    assert power(n) >= 0.8 - 0.013
    assert power(n - 1) < 0.8 + 0.013
    assert intervals.seeds_to_show_equivalence(0.06, sd, margin, paired=True) is None


def _effect(a, b, seeds=None):
    seeds = seeds or [str(i) for i in range(len(a))]
    sides = (tuple(zip(seeds, a, strict=True)), tuple(zip(seeds, b, strict=True)))
    estimate, unpaired = compare_sides(*sides)
    return Effect("algorithm", ("grpo", "slca_grpo"), (), "val/reward/tool/mean", estimate,
                  unpaired, sides)  # fmt: skip


def test_the_verdicts():
    a = [0.40, 0.45, 0.38, 0.50, 0.42]
    assert verdict(_effect(a, [x + 0.10 for x in a]), 0.05) == "differs"
    close = [x + d for x, d in zip(a, [0.004, -0.003, 0.001, 0.002, -0.002], strict=True)]
    assert verdict(_effect(a, close), 0.05) == "equivalent within ±0.05"
    noisy = [x + d for x, d in zip(a, [0.06, -0.05, 0.04, -0.03, 0.01], strict=True)]
    said = verdict(_effect(a, noisy), 0.02)
    assert said.startswith("not separated at n=5 (~") and "to show equivalence" in said, said
    assert verdict(_effect([0.4], [0.5]), 0.05) == "too few runs"
    # far outside the margin and not separated: equivalence cannot be shown as measured
    wide = [x + d for x, d in zip(a, [0.2, -0.1, 0.3, -0.05, 0.1], strict=True)]
    assert "equivalence within ±0.01 not reachable as measured" in verdict(
        _effect(a, wide), 0.01
    )


def test_the_plain_reading_says_the_tables_verdict():
    """The report's "Read plainly" lines say what the differences table's verdict says."""
    from slca_exp.analysis.report import _reading

    a = [0.40, 0.45, 0.38, 0.50, 0.42]
    cases = {
        "differs": ([x + 0.10 for x in a], 0.05),
        "equivalent": ([x + d for x, d in zip(a, [0.004, -0.003, 0.001, 0.002, -0.002], strict=True)], 0.05),  # noqa: E501
        "not separated": ([x + d for x, d in zip(a, [0.06, -0.05, 0.04, -0.03, 0.01], strict=True)], 0.02),  # noqa: E501
        "unreachable": ([x + d for x, d in zip(a, [0.2, -0.1, 0.3, -0.05, 0.1], strict=True)], 0.01),  # noqa: E501
    }
    for name, (b, margin) in cases.items():
        effect = _effect(a, b)
        said, (line,) = verdict(effect, margin), _reading([effect], margin)[3:]
        if said.startswith("equivalent within"):
            assert f"equivalent within ±{margin:g}: the 90% interval" in line, (name, line)
        elif said.startswith("differs"):
            assert ": differs by " in line, (name, line)
        else:
            assert f": not separated at n={len(a)} " in line, (name, line)
            needed = re.search(r"~(\d+) to show equivalence", said)
            assert (
                f"about {needed.group(1)} to show it within ±{margin:g}" in line
                if needed
                else f"equivalence within ±{margin:g} is not reachable as measured" in line
            ), (name, said, line)
    assert {verdict(_effect(a, b), m).split(" (")[0] for b, m in cases.values()} == {
        "differs", "equivalent within ±0.05", "not separated at n=5"
    }  # fmt: skip


def test_the_variance_split_by_hand():
    a = [0.40, 0.45, 0.38]
    b = [0.46, 0.44, 0.45]  # d = 0.06, -0.01, 0.07
    per_prompt = [[0.1, 0.0, 0.1, 0.04], [0.0, -0.02, 0.0, -0.02], [0.1, 0.1, 0.0, 0.08]]
    split = split_of(_effect(a, b), per_prompt)
    d = [0.06, -0.01, 0.07]
    mean = sum(d) / 3
    between = sum((x - mean) ** 2 for x in d) / 2
    evaluation = sum(
        sum((x - sum(p) / 4) ** 2 for x in p) / 3 / 4 for p in per_prompt
    ) / 3  # var(b_p - a_p) / R, averaged over seeds
    # hand sums in another order than numpy's: equal up to rounding (rel 1e-9)
    assert split.mean == pytest.approx(mean, rel=1e-9)
    assert split.between == pytest.approx(between, rel=1e-9)
    assert split.evaluation == pytest.approx(evaluation, rel=1e-9)
    assert split.training == pytest.approx(max(0.0, between - evaluation), rel=1e-9)
    assert split.rows == 4 and split.seeds == 3
    assert split.sd_at(8) == pytest.approx(math.sqrt(split.training + evaluation / 2), rel=1e-9)


def test_the_variance_split_recovers_known_parts_in_simulation():
    """Studies simulated with a training variance T and per-prompt noise: the split's averages
    over 2000 studies land within 5% of the truth (each estimate is unbiased; 5% is more than
    4 standard errors of the averages, measured 1.2% and 0.9%)."""
    rng = np.random.default_rng(11)
    train_var, prompt_sd, rows, seeds = 0.002, 0.3, 32, 5
    evaluation_truth = prompt_sd**2 / rows
    got_e, got_t = [], []
    for _ in range(2000):
        effects = rng.normal(0.0, math.sqrt(train_var), seeds)
        per_prompt = [rng.normal(e, prompt_sd, rows) for e in effects]
        b = [float(np.mean(p)) for p in per_prompt]
        split = split_of(_effect([0.0] * seeds, b), per_prompt)
        got_e.append(split.evaluation)
        got_t.append(split.between - split.evaluation)  # unclipped: unbiased
    assert np.mean(got_e) == pytest.approx(evaluation_truth, rel=0.05)
    assert np.mean(got_t) == pytest.approx(train_var, rel=0.05)


def test_the_performance_profile_is_the_fraction_above_each_threshold():
    assert profile([0.2, 0.4, 0.6, 0.8], [0.0, 0.4, 0.5, 1.0]) == [1.0, 0.5, 0.5, 0.0]


@pytest.fixture
def study(tmp_path):
    """A 2-algorithm x 4-seed sweep whose runs log their final validation rollouts."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("iso", artifact_location=(tmp_path / "art").as_uri())
    parent = client.create_run(exp, tags={"slca.sweep": "iso2", "slca.role": "parent",
                                          "slca.swept": '["algorithm", "seed"]'})  # fmt: skip
    rng = random.Random(9)
    finals, prompts = {}, {}
    for algo in ("grpo", "slca_grpo"):
        for seed in range(4):
            scores = [round(rng.uniform(0.2, 0.8), 3) for _ in range(6)]
            finals[algo, seed], prompts[algo, seed] = float(np.mean(scores)), scores
            run = client.create_run(exp, tags={"mlflow.parentRunId": parent.info.run_id})
            client.log_batch(
                run.info.run_id,
                metrics=[Metric("val/reward/tool/mean", finals[algo, seed], 0, 5)],
                params=[Param("seed", str(seed)), Param("algorithm.name", algo)],
                tags=[RunTag("slca.swept.algorithm", algo), RunTag("slca.swept.seed", str(seed))],
            )
            records = [
                replace(r, rewards=replace(r.rewards, tool=score))
                for r, score in zip(
                    (record(split="val", step=5, group=f"val-{k}", rank="") for k in range(6)),
                    scores,
                    strict=True,
                )
            ]
            path = write_records(records, tmp_path / f"{algo}{seed}.jsonl")
            folder = str(Path(artifact_path("val", 5, "jsonl")).parent)
            renamed = path.with_name(Path(artifact_path("val", 5, "jsonl")).name)
            path.rename(renamed)
            client.log_artifact(run.info.run_id, str(renamed), folder)
            client.set_terminated(run.info.run_id)
    client.set_terminated(parent.info.run_id)
    return uri, finals, prompts


def test_compare_prints_the_intervals_the_tost_verdict_and_the_variance_split(
    study, tmp_path, capsys
):
    uri, finals, prompts = study
    code = compare_main(["iso2", "--tracking-uri", uri, "--metric", "val/reward/tool/mean",
                         "--margin", "0.05", "--variance", "--out", str(tmp_path / "c"),
                         "--report", str(tmp_path / "report.md")])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert "interval estimates per cell" in out and "evaluation noise and training noise" in out
    a = [finals["grpo", s] for s in range(4)]
    b = [finals["slca_grpo", s] for s in range(4)]
    got = intervals.level_intervals(a, b, paired=True)
    table = (tmp_path / "c" / "intervals.md").read_text()  # the console wraps long cells
    for value in (got.iqm_a, got.iqm_b, got.mean_diff, got.poi):
        assert f"| {value.text()} |" in table, (value, table)
    weighed = intervals.tost(a, b, 0.05, paired=True)
    assert f"| {weighed.p:.3g} |" in table
    expected = verdict(_effect(a, b), 0.05)
    assert paired(a, b).n == 4
    assert f"| {expected} |" in (tmp_path / "c" / "differences.md").read_text()
    # the variance split: each seed's per-prompt differences, from the logged rollouts
    per_seed = [
        [y - x for x, y in zip(prompts["grpo", s], prompts["slca_grpo", s], strict=True)]
        for s in range(4)
    ]
    split = split_of(_effect(a, b), per_seed)
    report = (tmp_path / "report.md").read_text()
    assert f"| {math.sqrt(split.between):.4g} |" in report
    assert "## Interval estimates" in report and "## Evaluation noise and training noise" in report
    assert "Equivalence margin ±0.05" in report
    assert (tmp_path / "c" / "profiles.png").is_file()


def test_a_split_refuses_runs_that_logged_only_some_of_their_validation_rollouts():
    from slca_exp.analysis.variance import _holds_all

    scores = [0.2, 0.4, 0.9, 0.5]
    records = [
        replace(r, rewards=replace(r.rewards, tool=x))
        for r, x in zip((record(split="val", group=f"val-{k}") for k in range(4)), scores,
                        strict=True)
    ]  # fmt: skip
    assert _holds_all(records, "tool", sum(scores) / 4)
    assert not _holds_all(records[:2], "tool", sum(scores) / 4)  # the first 2 of 4 logged


def test_a_sweep_part_way_is_compared_on_its_finished_runs_and_says_which_it_left_out(
    study, tmp_path, capsys
):
    uri, finals, _ = study
    client = MlflowClient(uri)
    (killed,) = [
        r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])
        if r.data.tags.get("slca.swept.seed") == "3"
        and r.data.tags.get("slca.swept.algorithm") == "slca_grpo"
    ]  # fmt: skip
    client.set_terminated(killed.info.run_id, "KILLED")
    args = ["iso2", "--tracking-uri", uri, "--metric", "val/reward/tool/mean"]
    assert compare_main([*args, "--out", str(tmp_path / "c")]) == 0
    err = capsys.readouterr().err
    assert f"leaving out 1 run(s) that did not finish: {killed.info.run_id} (KILLED)" in err
    a = [finals["grpo", s] for s in range(3)]
    b = [finals["slca_grpo", s] for s in range(3)]
    expected = paired(a, b)  # the three seeds both algorithms finished
    table = (tmp_path / "c" / "differences.md").read_text()
    assert f"| 3 (1 unpaired) | paired t | {expected.mean:+.4g} |" in table, table


def test_a_study_file_compares_exactly_as_its_store_does(study, tmp_path, capsys):
    """``--save-study`` keeps all compare reads: the report, table, differences and intervals
    written from the file are the store's, byte for byte, but for the command line they name;
    the copy shows the store's run ids; saved again from its copy, the file is the same bytes."""
    uri, _, _ = study
    args = ["--metric", "val/reward/tool/mean", "--margin", "0.05", "--variance"]
    saved = tmp_path / "iso2.json.gz"
    again = tmp_path / "again.json.gz"

    def written(target, folder, study_file):
        out = tmp_path / folder
        return compare_main([*target, *args, "--out", str(out), "--report", str(out / "r.md"),
                             "--save-study", str(study_file)])  # fmt: skip

    assert written(["iso2", "--tracking-uri", uri], "a", saved) == 0
    assert written([str(saved)], "b", again) == 0
    out = capsys.readouterr().out
    assert "MLflow compare page" not in out.split("study file:")[-1]  # a temporary store
    for name in ("table.md", "differences.md", "intervals.md"):
        assert (tmp_path / "a" / name).read_text() == (tmp_path / "b" / name).read_text(), name
    store, copy = ((tmp_path / d / "r.md").read_text().splitlines() for d in ("a", "b"))
    assert store[2].startswith("Written by `slca-exp compare iso2 ")
    assert copy[2].startswith(f"Written by `slca-exp compare {saved} ")
    assert store[:2] + store[3:] == copy[:2] + copy[3:]
    parent = MlflowClient(uri).search_runs(
        [e.experiment_id for e in MlflowClient(uri).search_experiments()],
        filter_string="tags.`slca.role` = 'parent'",
    )[0]
    assert f"(parent run {parent.info.run_id})" in "\n".join(copy)
    assert again.read_bytes() == saved.read_bytes()


def test_a_study_file_is_refused_with_the_reason(study, tmp_path, capsys):
    import gzip
    import json

    uri, _, _ = study
    assert compare_main([str(tmp_path / "none.json.gz")]) == 2
    assert "no study file at" in capsys.readouterr().err
    other = tmp_path / "other.json.gz"
    other.write_bytes(gzip.compress(json.dumps({"format": "something else"}).encode()))
    assert compare_main([str(other)]) == 2
    err = capsys.readouterr().err
    assert "is not a study file of this slca-exp (format 'something else'" in err
    assert "--save-study" in err
    other.write_bytes(b"not gzip")
    assert compare_main([str(other)]) == 2
    assert f"{other} is not a study file" in capsys.readouterr().err
    saved = tmp_path / "s.json.gz"
    assert compare_main(["iso2", "--tracking-uri", uri, "--out", str(tmp_path / "c"),
                         "--save-study", str(saved)]) == 0  # fmt: skip
    with pytest.raises(SystemExit) as exit_:
        compare_main([str(saved), "--tracking-uri", uri])
    assert exit_.value.code == 2
    assert "a study file is its own store" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        compare_main(["iso2", "--tracking-uri", uri, "--save-study", str(tmp_path / "s.json")])
    assert "a study file's name ends with .json.gz" in capsys.readouterr().err


def test_a_restored_study_joins_its_experiment_in_another_store_and_compares_as_saved(
    study, tmp_path, capsys
):
    """``slca-exp restore`` writes a study file's sweep into a store that already has its
    experiment: the runs there are left alone, the sweep compares as in its own store, and a
    second restore, or one of a study without a sweep, is refused with the reason."""
    from slca_exp.commands.restore import main as restore_main

    uri, _, _ = study
    saved = tmp_path / "iso2.json.gz"
    metric = ["--metric", "val/reward/tool/mean"]
    assert compare_main(["iso2", "--tracking-uri", uri, *metric, "--out", str(tmp_path / "a"),
                         "--save-study", str(saved)]) == 0  # fmt: skip
    other = f"sqlite:///{tmp_path / 'other' / 'mlflow.db'}"
    (tmp_path / "other").mkdir()
    client = MlflowClient(other)
    exp = client.create_experiment("iso", artifact_location=(tmp_path / "other-art").as_uri())
    theirs = client.create_run(exp, run_name="someone else's")
    client.log_metric(theirs.info.run_id, "val/reward/tool/mean", 0.5)
    capsys.readouterr()

    assert restore_main([str(saved), "--tracking-uri", other]) == 0
    out = capsys.readouterr().out
    assert f"restored sweep iso2 into {other}: parent run " in out
    assert "8 runs (8 FINISHED)" in out and "to resume it" not in out  # it recorded no command
    runs = client.search_runs([exp])
    assert len(runs) == 1 + 1 + 8
    mine = client.get_run(theirs.info.run_id)
    assert mine.data.metrics == {"val/reward/tool/mean": 0.5}
    assert "slca.copy_of" not in mine.data.tags
    assert compare_main(["iso2", "--tracking-uri", other, *metric, "--out", f"{tmp_path}/b"]) == 0
    for name in ("table.md", "differences.md"):
        assert (tmp_path / "a" / name).read_text() == (tmp_path / "b" / name).read_text(), name
    capsys.readouterr()

    assert restore_main([str(saved), "--tracking-uri", other]) == 2
    assert f"{other} already holds sweep iso2 (parent run " in capsys.readouterr().err
    source = MlflowClient(uri)  # an experiment's runs, outside any sweep
    loose = source.create_experiment("loose", artifact_location=(tmp_path / "l").as_uri())
    for seed in (0, 1):
        run = source.create_run(loose, tags={"slca.swept.seed": str(seed)})
        source.log_metric(run.info.run_id, "val/reward/tool/mean", 0.1 * seed)
        source.set_terminated(run.info.run_id)
    runs_only = tmp_path / "loose.json.gz"
    assert compare_main(["loose", "--tracking-uri", uri, *metric, "--out", str(tmp_path / "c"),
                         "--save-study", str(runs_only)]) == 0  # fmt: skip
    capsys.readouterr()
    assert restore_main([str(runs_only), "--tracking-uri", other]) == 2
    assert "holds the runs of experiment 'loose', not a sweep" in capsys.readouterr().err
    assert restore_main([str(tmp_path / "none.json.gz")]) == 2
    assert "no such file" in capsys.readouterr().err
