"""``slca-exp rejudge``'s agreement figures and its refusals (the real sweep: tests/engines)."""

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import spearmanr

from slca_exp.commands import main
from slca_exp.commands.rejudge import agreement

ratings = st.lists(st.tuples(st.integers(1, 5), st.integers(1, 5)), min_size=1, max_size=60)


def kappa_by_matrices(old, new):
    """Cohen's quadratically weighted kappa, from the confusion matrix (a second derivation)."""
    confusion = np.zeros((5, 5))
    for a, b in zip(old, new, strict=True):
        confusion[a - 1, b - 1] += 1
    weights = np.array([[(i - j) ** 2 for j in range(5)] for i in range(5)]) / 16
    expected = np.outer(confusion.sum(1), confusion.sum(0)) / confusion.sum()
    chance = (weights * expected).sum()
    return math.nan if chance == 0 else 1 - (weights * confusion).sum() / chance


@settings(max_examples=200, deadline=None)
@given(pairs=ratings)
def test_agreement_matches_independent_derivations_on_random_ratings(pairs):
    old, new = [a for a, _ in pairs], [b for _, b in pairs]
    got = agreement(old, new)
    assert got["n"] == len(pairs)
    assert got["exact"] == sum(a == b for a, b in pairs) / len(pairs)
    want = kappa_by_matrices(old, new)
    # 1e-12: the two derivations sum the same products in a different order
    assert (math.isnan(got["kappa"]) and math.isnan(want)) or abs(got["kappa"] - want) < 1e-12
    if len(set(old)) > 1 and len(set(new)) > 1:
        assert got["spearman"] == float(spearmanr(old, new)[0])
    else:
        assert math.isnan(got["spearman"])  # a constant rating has no rank correlation


def test_overrides_that_name_no_judge_are_refused_with_the_fix(capsys):
    assert main(["rejudge", "some-sweep", "seed=3"]) == 2
    err = capsys.readouterr().err
    assert "'seed=3' is not a judge override" in err and "judge=openai" in err
    assert main(["rejudge", "some-sweep"]) == 2
    assert "no judge given" in capsys.readouterr().err


def test_an_agreement_that_rounds_to_zero_prints_without_a_sign():
    from slca_exp.commands.rejudge import _agreement_text

    text = _agreement_text({"n": 3, "spearman": math.nan, "exact": 0.5, "kappa": -1e-17})
    assert text.endswith("weighted kappa 0.000") and "rho -," in text
