import re
from pathlib import Path

import pytest

from slca_exp.core import names

GLOSSARY = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def test_every_design_metric_is_defined_once():
    m = names.METRICS
    for seg in ("tool", "summary"):
        for stat in ("mean", "std", "abs_mean", "min", "max"):
            assert f"adv/{seg}/{stat}" in m
        for key in ("present_frac", "zeroed_group_frac", "tokens/mean"):
            assert f"segment/{seg}/{key}" in m
    assert "val/success@0.9" in m and "reward/no_call/frac" in m
    assert all(doc for doc in m.values())


def test_helpers_refuse_unknown_segments_and_stats():
    with pytest.raises(ValueError, match="segment"):
        names.adv("summry", "mean")
    with pytest.raises(ValueError, match="statistic"):
        names.adv("tool", "median")


def test_docs_glossary_lists_exactly_the_metrics():
    text = GLOSSARY.read_text()
    glossary = text.split("## Metric glossary", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `([^`]+)` \|", glossary, flags=re.M))
    assert listed == set(names.METRICS)
