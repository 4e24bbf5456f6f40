"""The HTML credit view, read back with Python's HTML parser: one element per response token in
order, segments, the diverging shade (monotone in the advantage, on one scale for the page), no
shade off the learnable tokens, escaping, no external reference, the legend's end points."""

from __future__ import annotations

import dataclasses
import math
import random
import re
from html.parser import HTMLParser

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slca_exp.rollouts.record import CODE_SEGMENTS, SEGMENT_CODES, RolloutRecord
from slca_exp.tracking.credit_view import EPSILON, RAMPS, render_credit_view, scale_limit, shade
from tests.rollouts.samples import record, step_records

ALLOWED_TAGS = {"html", "head", "meta", "title", "style", "body", "header", "h1", "h2", "div"}
ALLOWED_TAGS |= {"section", "span", "b", "p"}
EXTERNAL = re.compile(r"https?:|//|url\(|@import|<link|src=|href=|<script|<iframe|<img", re.I)


class Page(HTMLParser):
    """Tags, sections and their token spans (attributes and text) of a rendered page."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.sections: list[dict] = []
        self.legend = ""
        self._token: dict | None = None
        self._legend_depth = 0
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append((tag, attrs))
        if self._legend_depth or attrs.get("id") == "legend":
            self._legend_depth += 1
        if tag == "section":
            self.sections.append({"attrs": attrs, "tokens": [], "meta": ""})
        if tag == "span" and "tok" in attrs.get("class", "").split():
            assert self._token is None, "a token element inside a token element"
            self._token = {"attrs": attrs, "text": ""}
            self.sections[-1]["tokens"].append(self._token)

    def handle_endtag(self, tag):
        if self._legend_depth:
            self._legend_depth -= 1
        if tag == "span" and self._token is not None:
            self._token = None

    def handle_data(self, data):
        if self._token is not None:
            self._token["text"] += data
        elif self._legend_depth:
            self.legend += data
        elif self.sections:
            self.sections[-1]["meta"] += data

    @property
    def tokens(self) -> list[dict]:
        return [t for s in self.sections for t in s["tokens"]]


def parse(records, title="step 10") -> Page:
    return Page(render_credit_view(records, title=title))


def rgb_of(token: dict) -> tuple[int, int, int] | None:
    style = token["attrs"].get("style")
    if style is None:
        return None
    found = re.fullmatch(r"background:#([0-9a-f]{6})(;color:#fff)?", style)
    assert found, style
    h = found.group(1)
    return int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16)


def signed_shade(rgb: tuple[int, int, int] | None) -> int:
    """Distance from white, signed by the hue's side (red: +, blue: -); 0 for no shade."""
    if rgb is None:
        return 0
    r, _, b = rgb
    assert r != b, rgb
    darkness = 765 - sum(rgb)
    return darkness if r > b else -darkness


def with_advantages(rec: RolloutRecord, values) -> RolloutRecord:
    return dataclasses.replace(rec, advantages=list(values))


def with_tokens(rec: RolloutRecord, texts, codes: str, advantages=None) -> RolloutRecord:
    n = len(texts)
    return dataclasses.replace(
        rec,
        token_ids=list(range(100, 100 + n)),
        token_text=list(texts),
        segments=codes,
        response="".join(texts),
        advantages=list(advantages) if advantages is not None else [None] * n,
        logprobs=[None] * n,
    )


def random_page(seed: int) -> list[RolloutRecord]:
    """The sample step with random per-token advantages (zeros, tiny ones, repeats among them)."""
    rng = random.Random(seed)
    records = []
    for rec in step_records():
        scale = rng.choice([0.01, 1.0, 5.0])
        pool = [0.0, 1e-9, -1e-9, *(rng.uniform(-scale, scale) for _ in range(3))]
        values = [
            None
            if code == "e"
            else rng.choice(pool)
            if rng.random() < 0.5
            else rng.uniform(-scale, scale)
            for code in rec.segments
        ]
        records.append(with_advantages(rec, values))
    return records


@pytest.mark.parametrize("split", ["train", "val"])
def test_one_token_element_per_response_token_in_order_and_their_text_is_the_response(split):
    records = step_records(split=split)
    page = parse(records)
    assert len(page.sections) == len(records)
    for section, rec in zip(page.sections, records, strict=True):
        tokens = section["tokens"]
        assert len(tokens) == len(rec.token_ids)
        assert [int(t["attrs"]["data-id"]) for t in tokens] == rec.token_ids
        assert [t["text"] for t in tokens] == rec.token_text
        assert "".join(t["text"] for t in tokens) == rec.response
    assert len(page.tokens) == sum(len(r.token_ids) for r in records)


def test_token_elements_carry_the_record_s_segments():
    records = [*step_records(), *step_records(split="val")]
    for section, rec in zip(parse(records).sections, records, strict=True):
        segs = [t["attrs"]["data-seg"] for t in section["tokens"]]
        assert "".join(SEGMENT_CODES[s] for s in segs) == rec.segments
        for token, seg in zip(section["tokens"], segs, strict=True):
            assert f"seg-{seg}" in token["attrs"]["class"].split()
        assert {"tool", "summary", "env"} <= set(segs)


def test_the_page_s_section_attributes_and_facts():
    records = step_records()
    page = parse(records)
    for section, rec in zip(page.sections, records, strict=True):
        attrs = section["attrs"]
        assert attrs["class"] == "rollout"
        assert (attrs["data-group"], attrs["data-sample"], attrs["data-rank"]) == (
            rec.group,
            str(rec.sample),
            rec.rank,
        )
        assert (attrs["data-step"], attrs["data-split"]) == ("10", "train")
        meta = section["meta"]
        assert (
            f"tool {rec.segment_tokens('tool')} · summary {rec.segment_tokens('summary')}" in meta
        )
        assert f"A tool {rec.tool_adv:+.3f}" in meta and f"A summary {rec.summary_adv:+.3f}" in meta
        assert "ends on tool call no" in meta and "value 0.50" in meta
    failed = page.sections[3]["meta"]  # the judge failed on this one: its total is NaN
    assert "judge failed: HTTP 500 after 1 attempt" in failed and "routed total n/a" in failed
    assert "rating 1 (0.000)" in page.sections[1]["meta"]


@pytest.mark.parametrize("seed", range(8))
def test_the_shade_moves_monotonically_with_the_advantage_on_one_scale_for_the_page(seed):
    records = random_page(seed)
    limit = scale_limit(records)
    shaded = []
    for section, rec in zip(parse(records).sections, records, strict=True):
        for token, adv in zip(section["tokens"], rec.advantages, strict=True):
            if adv is not None:
                assert float(token["attrs"]["data-adv"]) == pytest.approx(adv, rel=1e-3, abs=1e-12)
                shaded.append((adv, signed_shade(rgb_of(token))))
    assert limit == max(abs(a) for a, _ in shaded)
    shaded.sort()
    for (a1, s1), (a2, s2) in zip(shaded, shaded[1:], strict=False):
        assert s1 <= s2, (a1, s1, a2, s2)
        if a1 == a2:
            assert s1 == s2
        elif a1 * a2 > 0 and abs(abs(a2) - abs(a1)) > 0.05 * limit:
            assert abs(s1) != abs(s2), (a1, s1, a2, s2)  # visibly apart
    for adv, s in shaded:  # the sign gives the hue's side; zero (and what rounds to it) is white
        assert s * adv >= 0 and (adv != 0 or s == 0), (adv, s)
        assert s != 0 or abs(adv) <= 0.01 * limit, (adv, s)
    ends = {max(a for a, _ in shaded): RAMPS[True][-1], min(a for a, _ in shaded): RAMPS[False][-1]}
    end = max(ends, key=abs)  # the largest |advantage| on the page is the scale's end colour
    assert shade(end, limit) == "#" + ends[end]


@settings(max_examples=200, deadline=None)
@given(
    st.floats(-3, 3, allow_nan=False),
    st.floats(-3, 3, allow_nan=False),
    st.floats(1e-3, 2),
)
def test_shade_is_monotone_and_its_sign_gives_the_hue_side(a, b, limit):
    low, high = sorted((a, b))
    colours = (shade(low, limit), shade(high, limit))
    to_rgb = [
        None if c is None else tuple(int(c[k : k + 2], 16) for k in (1, 3, 5)) for c in colours
    ]
    assert signed_shade(to_rgb[0]) <= signed_shade(to_rgb[1])
    for value, rgb in zip((low, high), to_rgb, strict=True):
        if value == 0:
            assert rgb is None
        elif rgb is not None:
            assert (rgb[0] > rgb[2]) == (value > 0)


def test_env_tokens_and_validation_records_carry_no_shade():
    train = step_records()
    forced = [  # an advantage where the mask is 0 is still not shown
        with_advantages(
            r, [1.5 if c == "e" else a for c, a in zip(r.segments, r.advantages, strict=True)]
        )
        for r in train
    ]
    page = parse(forced)
    env = [t for t in page.tokens if t["attrs"]["data-seg"] == "env"]
    assert env and all("style" not in t["attrs"] and "data-adv" not in t["attrs"] for t in env)
    assert all("id " in t["attrs"]["title"] and "A=" not in t["attrs"]["title"] for t in env)
    assert scale_limit(forced) == pytest.approx(1.1)  # env values do not set the scale
    learnable = [t for t in page.tokens if t["attrs"]["data-seg"] != "env"]
    assert all("style" in t["attrs"] for t in learnable if float(t["attrs"]["data-adv"]) != 0)

    val = parse(step_records(split="val"))
    assert val.tokens and all("style" not in t["attrs"] for t in val.tokens)
    assert all("data-adv" not in t["attrs"] for t in val.tokens)
    assert "no token advantages on this page" in val.legend


def test_all_zero_advantages_leave_every_token_neutral():
    records = [with_advantages(r, [0.0] * len(r.advantages)) for r in step_records()]
    page = parse(records)
    assert scale_limit(records) == EPSILON
    assert all("style" not in t["attrs"] for t in page.tokens)
    assert all(
        t["attrs"]["data-adv"] == "0" for t in page.tokens if t["attrs"]["data-seg"] != "env"
    )


def test_the_legend_lists_the_scale_s_end_points():
    records = step_records()
    page = parse(records)
    assert scale_limit(records) == pytest.approx(1.1)  # the worst rollout's tool advantage
    legend = next(a for t, a in page.tags if a.get("id") == "legend")
    assert legend["class"] == "legend"
    assert "-1.1" in page.legend and "+1.1" in page.legend
    bar = next(a for t, a in page.tags if a.get("class") == "scale-bar")
    assert (float(bar["data-min"]), float(bar["data-max"])) == (-1.1, 1.1)
    for key in ("seg-tool", "seg-summary", "seg-env"):
        assert any(a.get("class") == f"key {key}" for _, a in page.tags)
    assert "tool segment" in page.legend and "summary segment" in page.legend
    assert "no advantage" in page.legend
    scaled = [
        with_advantages(r, [None if a is None else a * 3 for a in r.advantages]) for r in records
    ]
    assert "+3.3" in parse(scaled).legend and "-3.3" in parse(scaled).legend


HOSTILE = ["<script>alert(1)</script>", '"><img src=x onerror=alert(1)>', "&amp; &#60;", "</span>"]


def test_token_text_and_facts_are_escaped():
    base = record(group='<script>alert("g")</script>')
    texts = [*HOSTILE, "a\r\nb", "\n", " ", ""]
    rec = with_tokens(base, texts, "t" * 4 + "eess", [0.5] * 4 + [None] * 4)
    text = render_credit_view([rec], title="<script>alert('t')</script>")
    page = Page(text)
    assert [t["text"] for t in page.tokens] == texts
    assert "".join(t["text"] for t in page.tokens) == rec.response
    assert page.sections[0]["attrs"]["data-group"] == base.group
    assert "<script" not in text.lower()  # the text holds "src=": as text, not an attribute
    assert {tag for tag, _ in page.tags} <= ALLOWED_TAGS
    assert page.tokens[5]["attrs"]["class"] == "tok seg-env ws nl"  # a lone newline
    assert page.tokens[6]["attrs"]["class"] == "tok seg-summary ws"  # a lone space


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=8), min_size=1, max_size=12), st.text(max_size=12))
def test_no_input_makes_a_tag_or_loses_text(texts, title):
    codes = "".join(random.Random(len(texts)).choice("tse-") for _ in texts)
    rec = with_tokens(record(), texts, codes, [0.25 if c in "ts" else None for c in codes])
    text = render_credit_view([rec], title=title)
    page = Page(text)
    assert "<script" not in text.lower()
    assert {tag for tag, _ in page.tags} <= ALLOWED_TAGS
    assert not any(
        name.startswith("on") or name in ("src", "href") for _, a in page.tags for name in a
    )
    assert [t["text"] for t in page.tokens] == texts
    assert [t["attrs"]["data-seg"] for t in page.tokens] == [CODE_SEGMENTS[c] for c in codes]


def test_the_page_is_self_contained_deterministic_and_has_one_style_block():
    records = [*step_records(), *step_records(split="val")]
    text = render_credit_view(records, title="step 10")
    assert EXTERNAL.search(text) is None, EXTERNAL.search(text)
    assert "@font-face" not in text and text.count("<style>") == 1
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    again = [dataclasses.replace(r) for r in step_records()] + step_records(split="val")
    assert render_credit_view(again, title="step 10") == text
    empty = render_credit_view([], title="nothing")
    assert 'id="legend"' in empty and "No rollouts." in empty


def test_per_token_lists_of_different_lengths_are_refused():
    rec = step_records()[0]
    with pytest.raises(ValueError, match="per-token lists differ"):
        render_credit_view([dataclasses.replace(rec, segments=rec.segments[:-1])], title="x")


def test_a_nan_advantage_is_neutral_and_its_scale_ignores_it():
    rec = step_records()[0]
    values = [math.nan if a is not None else None for a in rec.advantages]
    values[0] = 0.3
    page = parse([with_advantages(rec, values)])
    assert rgb_of(page.tokens[0]) == (178, 24, 43)  # 0.3 is the page's largest: the red end
    assert all(rgb_of(t) is None for t in page.tokens[1:])
