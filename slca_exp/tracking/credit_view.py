"""The HTML credit view: a step's logged rollouts token by token, shaded by their advantages.

    RolloutRecord, ...   (slca_exp.rollouts: one per logged rollout of a step)
      -> render_credit_view(records, title=...)
      -> one self-contained HTML page   (rollouts/<split>/step_<NNNNNN>.html, see ``files.py``)

The page is plain HTML and one ``<style>`` block: no script, no font, no link to anything, so it
opens offline (a cluster's login node, an MLflow artifact). A header holds the title and the
legend (``#legend``); then one ``section.rollout`` per record: its facts (group, sample, rank,
rewards, segment advantages, token counts), then every response token in order as one
``span.tok``. A token's background is its advantage on a diverging scale (ColorBrewer's RdBu:
blue negative, white zero, red positive) whose limit is the largest |advantage| on the page; its
segment is its underline (tool: solid green, summary: dashed purple); environment tokens (tool
responses, chat glue) are grey italic on grey hatching and never shaded. Hovering a token shows
its id, segment, advantage and log-prob (``title``, and a CSS tooltip). Where the record's ids
drift from the chat template's rendering of its conversation (``rollouts.drift``), the facts say
where first, and every differing token (or the token after a missing one) has a red outline
(``.drift``) whose tooltip names what the template has there.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

from slca_exp.rollouts.drift import TokenDrift
from slca_exp.rollouts.record import CODE_SEGMENTS, RolloutRecord

EPSILON = 1e-6
"""The smallest scale limit: on a page whose advantages are all zero or None nothing is shaded."""
RAMPS = {
    True: ("ffffff", "fddbc7", "f4a582", "d6604d", "b2182b"),
    False: ("ffffff", "d1e5f0", "92c5de", "4393c3", "2166ac"),
}
"""White to the scale's end, evenly spaced stops (RdBu): ``True`` positive, ``False`` negative."""
_FAIL = ' class="fail"'
_DARK = 400
"""A shade whose channels sum below this gets white text."""
_GRADIENT = ",".join(f"#{c}" for c in (*reversed(RAMPS[False]), *RAMPS[True][1:]))
_SANS = 'system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif'
_MONO = 'ui-monospace,SFMono-Regular,Menlo,Consolas,"DejaVu Sans Mono",monospace'
_CSS = f"""
body{{margin:0;padding:0 1.5em 2em;background:#fff;color:#111;font:14px/1.45 {_SANS}}}
header{{position:sticky;top:0;z-index:5;background:#fff;border-bottom:1px solid #ccc;
padding:.6em 0}}
h1{{font-size:1.3em;margin:0 0 .3em}} h2{{font-size:1.05em;margin:0 0 .3em}}
.legend{{display:flex;flex-wrap:wrap;gap:.4em 1.4em;align-items:center;font-size:13px}}
.scale{{display:flex;align-items:center;gap:.4em}}
.scale-bar{{display:inline-block;width:16em;height:.9em;border:1px solid #999;
background:linear-gradient(to right,{_GRADIENT})}}
.key{{font-family:{_MONO};padding:0 .3em}}
.rollout{{margin:1.2em 0;padding:.6em .8em;border:1px solid #ddd;border-radius:4px}}
.meta{{display:flex;flex-wrap:wrap;gap:.1em 1.2em;font-size:12.5px;color:#333;margin-bottom:.5em}}
.meta b{{color:#666;font-weight:600}} .fail{{color:#b2182b}}
.toks{{white-space:pre-wrap;word-break:break-word;font:13px/1.9 {_MONO}}}
.tok{{position:relative;box-shadow:inset -1px 0 #0002}} .tok:hover{{outline:1px solid #000}}
.tok:hover::after{{content:attr(title);position:absolute;left:0;top:1.7em;z-index:9;
background:#222;color:#fff;font:12px/1.3 {_SANS};font-style:normal;padding:2px 6px;
border-radius:3px;white-space:nowrap;pointer-events:none}}
.seg-tool{{border-bottom:2px solid #1b7837}} .seg-summary{{border-bottom:2px dashed #762a83}}
.seg-none{{border-bottom:2px dotted #999}}
.drift{{outline:2px solid #d7191c;outline-offset:-2px}}
.seg-env{{color:#666;font-style:italic;background-color:#e6e6e6;
background-image:repeating-linear-gradient(135deg,transparent 0 3px,#f6f6f6 3px 6px)}}
.ws{{padding-right:2px;outline:1px dotted #aaa;outline-offset:-1px}}
.nl::before{{content:"\\21b5";color:#999}} .tok:empty::before{{content:"\\2205";color:#999}}
"""


def render_credit_view(records: Sequence[RolloutRecord], *, title: str) -> str:
    """One self-contained HTML page showing ``records`` token by token (module docstring).

    Args:
        records: the rollouts, in page order (a step's, one split).
        title: the page's title and heading.

    Returns:
        The HTML document; the same records give the same text.

    Raises:
        ValueError: a record's per-token lists differ in length.

    """
    for rec in records:
        _check(rec)
    limit = scale_limit(records)
    body = [_section(rec, limit) for rec in records] or ['<p class="empty">No rollouts.</p>']
    return "\n".join(
        [
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">',
            f"<title>{_esc(title)}</title>",
            f"<style>{_CSS}</style></head><body>",
            f"<header><h1>{_esc(title)}</h1>{_runs(records)}{_legend(limit)}</header>",
            *body,
            "</body></html>\n",
        ]
    )


def scale_limit(records: Sequence[RolloutRecord]) -> float:
    """The largest |advantage| of a non-env token of ``records`` (at least :data:`EPSILON`)."""
    values = [
        abs(a)
        for rec in records
        for a, code in zip(rec.advantages, rec.segments, strict=False)
        if code != "e" and a is not None and math.isfinite(a)
    ]
    return max([EPSILON, *values])


def shade(advantage: float | None, limit: float) -> str | None:
    """An advantage's background on the scale (``#rrggbb``); None where it is neutral.

    Each channel moves monotonically from white (0) to the end colour of the advantage's sign
    (at ``±limit`` and beyond); None, non-finite and advantages that round to white are neutral.
    """
    if advantage is None or not math.isfinite(advantage) or advantage == 0:
        return None
    ramp = RAMPS[advantage > 0]
    pos = min(abs(advantage) / limit, 1.0) * (len(ramp) - 1)
    k = min(int(pos), len(ramp) - 2)
    low, high = _rgb(ramp[k]), _rgb(ramp[k + 1])
    rgb = [round(a + (b - a) * (pos - k)) for a, b in zip(low, high, strict=True)]
    colour = "#" + "".join(f"{c:02x}" for c in rgb)
    return None if colour == "#ffffff" else colour


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    return int(hex_colour[0:2], 16), int(hex_colour[2:4], 16), int(hex_colour[4:6], 16)


def _check(rec: RolloutRecord) -> None:
    lengths = {len(rec.token_ids), len(rec.token_text), len(rec.segments)}
    lengths |= {len(rec.advantages), len(rec.logprobs)}
    if len(lengths) != 1:
        raise ValueError(
            f"rollout {rec.group}/{rec.sample} (step {rec.step}): per-token lists differ in "
            f"length ({len(rec.token_ids)} ids, {len(rec.token_text)} texts, "
            f"{len(rec.segments)} segments, {len(rec.advantages)} advantages, "
            f"{len(rec.logprobs)} log-probs)"
        )


def _esc(text: str) -> str:
    """HTML-escaped text (quotes too); a carriage return kept as one (the parser drops it)."""
    return html.escape(text, quote=True).replace("\r", "&#13;")


def _num(value: float | None, spec: str = ".3f") -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    return format(value, spec)


def _runs(records: Sequence[RolloutRecord]) -> str:
    """The run(s) the records come from: algorithm, seed, engine."""
    seen = dict.fromkeys(
        " · ".join(f"{k} {rec.run[k]}" for k in ("algorithm", "seed", "engine") if k in rec.run)
        for rec in records
    )
    return f'<div class="runs">run: {_esc(" | ".join(seen))}</div>' if seen else ""


def _legend(limit: float) -> str:
    low, high = f"{-limit:+.3g}", f"{limit:+.3g}"
    note = "" if limit > EPSILON else " (no token advantages on this page: all neutral)"
    return (
        f'<div id="legend" class="legend"><span class="scale">advantage'
        f'<span class="scale-min">{low}</span>'
        f'<span class="scale-bar" data-min="{low}" data-max="{high}"'
        f' title="blue negative, white 0, red positive"></span>'
        f'<span class="scale-max">{high}</span></span>'
        f"<span>limit: the largest |A| on the page{note}</span>"
        '<span><span class="key seg-tool">tool</span> tool segment (every assistant turn but'
        ' the last)</span><span><span class="key seg-summary">summary</span> summary segment'
        ' (the last assistant turn)</span><span><span class="key seg-env">env</span> injected'
        " by the environment (tool responses, chat glue): masked, no advantage</span>"
        '<span><span class="key seg-none">none</span> learnable, in neither segment</span>'
        "</div>"
    )


def _section(rec: RolloutRecord, limit: float) -> str:
    facts = {"group": rec.group, "sample": rec.sample, "step": rec.step, "split": rec.split}
    facts["rank"] = rec.rank
    attrs = " ".join(f'data-{k}="{_esc(str(v))}"' for k, v in facts.items())
    heading = f"{rec.group} · sample {rec.sample}" + (f" · {rec.rank}" if rec.rank else "")
    marks: dict[int, str] = {}
    for position, expected in rec.drift.marks if rec.drift is not None else ():
        marks[int(position)] = marks.get(int(position), "") + expected
    tokens = "".join(_token(rec, i, limit, marks) for i in range(len(rec.token_ids)))
    return (
        f'<section class="rollout" {attrs}><h2>{_esc(heading)}</h2>{_meta(rec)}'
        f'<div class="toks">{tokens}</div></section>'
    )


def _meta(rec: RolloutRecord) -> str:
    """The rollout's facts, one ``<span>`` each."""
    r = rec.rewards
    parts = ", ".join(f"{k} {_num(v, '.2f')}" for k, v in r.components.items())
    summary = "rating n/a" if r.rating is None else f"rating {r.rating} ({_num(r.summary)})"
    if r.raw_rating is not None and r.raw_rating != r.rating:
        summary += f", judge rated {r.raw_rating} (judge.noise)"
    judge = f" · judge {r.judge_status}: {r.judge_reason}" if r.judge_status != "ok" else ""
    if r.hierr is not None:  # the outcome reward: R_tool is the verdict, HierR only logged
        judge += f" · outcome {r.outcome or 'n/a'}, HierR {_num(r.hierr, '.2f')}"
    counts = " · ".join(
        f"{seg} {rec.segment_tokens(seg)}"
        for seg in ("tool", "summary", "env", "none")
        if seg != "none" or rec.segment_tokens(seg)
    )
    routed = f"{_num(r.total)} (tool {_num(r.routed_tool)}, summary {_num(r.routed_summary)})"
    fields = [
        ("group", rec.group),
        ("sample", str(rec.sample)),
        ("rank", rec.rank or "n/a"),
        ("step", str(rec.step)),
        ("split", rec.split),
        ("tool reward", f"{_num(r.tool)} ({parts})"),
        ("summary", summary + judge),
        ("routed total", routed),
        ("A tool", _num(rec.tool_adv, "+.3f")),
        ("A summary", _num(rec.summary_adv, "+.3f")),
        ("tokens", counts),
        ("ends on tool call", "yes" if rec.ends_on_tool_call else "no"),
    ]
    drift = rec.drift
    if drift is not None:
        fields.append(("token drift", _drift(drift)))
    if r.should_no_call:
        fields.append(("gold", "no call"))
    failed = {"summary": bool(judge), "token drift": bool(drift and drift.mismatched)}
    spans = (
        f"<span{_FAIL if failed.get(key) else ''}><b>{key}</b> {_esc(value)}</span>"
        for key, value in fields
    )
    return f'<div class="meta">{"".join(spans)}</div>'


def _drift(drift: TokenDrift) -> str:
    if not drift.mismatched:
        return "none: the ids are the chat template's rendering"
    return (
        f"{drift.mismatched} of {drift.tokens} tokens differ from the chat template's rendering; "
        f"first at {drift.first} ({drift.where}): the template has {drift.expected!r}, the "
        f"rollout {drift.found!r}"
    )


def _token(rec: RolloutRecord, i: int, limit: float, marks: dict[int, str]) -> str:
    """One token as a ``span.tok``: segment class, data attributes, shade and tooltip."""
    seg = CODE_SEGMENTS.get(rec.segments[i], "none")
    tid, text = rec.token_ids[i], rec.token_text[i]
    adv = rec.advantages[i] if seg != "env" else None
    adv = adv if adv is not None and math.isfinite(adv) else None
    logp = rec.logprobs[i]
    logp = logp if logp is not None and math.isfinite(logp) else None
    classes = f"tok seg-{seg}"
    if text and not text.strip():
        classes += " ws nl" if "\n" in text else " ws"
    tip = [f"id {tid}", seg if seg != "env" else "env (masked)"]
    if i in marks:
        classes += " drift"
        tip.append(f"drift: the template has {marks[i]!r}" if marks[i] else "drift")
    attrs = f'class="{classes}" data-seg="{seg}" data-id="{tid}"'
    if adv is not None:
        attrs += f' data-adv="{adv:.4g}"'
        tip.append(f"A={adv:+.3f}")
    if logp is not None:
        attrs += f' data-logp="{logp:.4g}"'
        tip.append(f"logp={logp:.3f}")
    colour = shade(adv, limit)
    if colour is not None:
        dark = sum(_rgb(colour[1:])) < _DARK
        attrs += f' style="background:{colour}{";color:#fff" if dark else ""}"'
    return f'<span {attrs} title="{_esc(" · ".join(tip))}">{_esc(text)}</span>'
