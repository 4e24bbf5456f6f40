"""``slca-exp rollouts``: a run's logged rollouts in the terminal, segment by segment.

    slca-exp rollouts RUN [--step N] [--val] [--best | --worst] [--html OUT] [--tracking-uri URI]

A training run logs a sample of its rollouts as artifacts (``slca_exp/rollouts/files.py``):
``rollouts/<split>/step_<NNNNNN>.jsonl``, one :class:`~slca_exp.rollouts.record.RolloutRecord`
per line. This command reads them back:

    store   --tracking-uri, else the store slca-exp train logs to (tracking/uris.py)
      -> run      RUN as a run id, else as a run name in any experiment of the store
      -> steps    the .jsonl files of rollouts/train (--val: rollouts/val)
      -> step     the last of them, or --step N
      -> records  that one file, downloaded into a temporary folder
      -> --best / --worst keeps the rollouts ranked so
      -> stdout   per rollout: header, rewards, segment advantages, the turns with their
                  segment markers and each call with its answer
      -> --html   the same rollouts' credit view (tracking/credit_view.py)

Colour (ANSI) is used only when stdout is a terminal and ``NO_COLOR`` is unset or empty
(no-color.org); piped or redirected output is plain text. Text a model wrote is printed with its
control characters escaped, so a rollout cannot drive the terminal. Every refusal (an unknown
run, an ambiguous name, a step that was not logged, a run without rollouts, bad flags) exits
with status 2 and a message on stderr that names what to pass instead.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

from slca_exp.core.names import TOOL_COMPONENTS
from slca_exp.core.shown import shown_uri
from slca_exp.rollouts.files import RECORDS, artifact_path, folder, read_records, step_of
from slca_exp.rollouts.record import SPLITS, Call, RolloutRecord, Turn

EXIT_OK = 0
EXIT_REFUSED = 2
PREFIX = "slca-exp rollouts: "
EVERY_SETTING = "tracking.rollouts.every"
"""The setting that makes a run log rollouts (0: none)."""
SHOWN_STEPS = 12
"""At most this many logged steps are listed one by one; longer lists are shortened."""
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


class RolloutsError(Exception):
    """A user-facing refusal (unknown run, step not logged, ...): exit status 2."""


# -- finding the run and its steps ----------------------------------------------------------------


def find_run(client: Any, target: str) -> Any:  # noqa: ANN401 - an mlflow Run
    """The run whose id is ``target``, else the only run named ``target`` in the store.

    Raises:
        RolloutsError: no such run, or several runs have that name (their ids, experiments and
            start times are listed).

    """
    if _looks_like_run_id(target):
        run = _get_run(client, target)
        if run is not None:
            return run
    experiments = {e.experiment_id: e.name for e in client.search_experiments()}
    ids = list(experiments)
    named = _named(client, ids, target) if ids else []
    if len(named) == 1:
        return named[0]
    where = shown_uri(client.tracking_uri)
    if named:
        listed = "\n".join(f"  {_describe(run, experiments)}" for run in named)
        raise RolloutsError(
            f"the run name {target!r} matches {len(named)} runs in {where}:\n{listed}\n"
            "pass one of these run ids instead of the name"
        )
    latest = (
        client.search_runs(ids, max_results=5, order_by=["attributes.start_time DESC"])
        if ids
        else []
    )
    hint = "".join(f"\n  {_describe(run, experiments)}" for run in latest)
    raise RolloutsError(
        f"no run with the id or name {target!r} in {where}; pass a run id or a run name "
        "(pass --tracking-uri if the run is in another store)."
        + (f" The latest runs:{hint}" if hint else " The store has no runs.")
    )


def _named(client: Any, experiment_ids: list[str], name: str) -> list[Any]:
    """The runs called ``name``, oldest first.

    MLflow's filter strings have no escape for a quote inside a value: a name is quoted with
    the quote it does not contain; a name with both kinds is matched here, over every run.
    """
    from slca_exp.tracking.sweep_runs import search_all

    quote = "'" if "'" not in name else '"'
    if quote in name:
        return [r for r in search_all(client, experiment_ids) if r.info.run_name == name]
    return search_all(client, experiment_ids, f"attributes.run_name = {quote}{name}{quote}")


def logged_steps(client: Any, run_id: str, split: str) -> list[int]:
    """The steps whose records (``rollouts/<split>/step_<N>.jsonl``) the run logged, in order."""
    suffix = f".{RECORDS}"
    files = client.list_artifacts(run_id, folder(split))
    return sorted(
        step
        for f in files
        if not f.is_dir and f.path.endswith(suffix) and (step := step_of(f.path)) is not None
    )


def choose_step(steps: Sequence[int], wanted: int | None, split: str, run_label: str) -> int:
    """``wanted``, or the last logged step when it is None.

    Raises:
        RolloutsError: ``wanted`` was not logged (the logged steps are listed).

    """
    if wanted is None:
        return steps[-1]
    if wanted not in steps:
        raise RolloutsError(
            f"--step {wanted}: {run_label} logged no {split} rollouts at step {wanted}; its "
            f"logged {split} steps: {compact_steps(steps)}. Pass one of them, or omit --step "
            "for the last."
        )
    return wanted


def no_rollouts_message(run_label: str, split: str, others: Sequence[int]) -> str:
    """Why ``split`` has nothing to show: none logged at all, or only the other split's."""
    if others:
        other = next(s for s in SPLITS if s != split)
        flag = "drop --val" if split == "val" else "add --val"
        return (
            f"{run_label} logged no {split} rollouts (rollouts/{split}/ is empty); it logged "
            f"{other} rollouts at steps {compact_steps(others)}: {flag}."
        )
    return (
        f"{run_label} logged no rollouts (its rollouts/train/ and rollouts/val/ artifact folders "
        f"are empty). A run logs them with {EVERY_SETTING}=N (the first RL step, every N-th and "
        f"every validation; {EVERY_SETTING}=0 turns them off): was it 0, or did the run stop "
        "before its first logged step?"
    )


def compact_steps(steps: Sequence[int]) -> str:
    """The steps as a short list: a regular stretch of four or more as ``a, b, ..., z``.

    >>> compact_steps([1, 10, 20, 30, 40, 50])
    '1, 10, 20, ..., 50 (6 steps)'
    >>> compact_steps([3, 7])
    '3, 7'
    """
    parts: list[str] = []
    i = 0
    while i < len(steps):
        j = i + 1
        while j + 1 < len(steps) and steps[j + 1] - steps[j] == steps[i + 1] - steps[i]:
            j += 1
        if j - i >= 3:
            parts.append(f"{steps[i]}, {steps[i + 1]}, ..., {steps[j]}")
            i = j + 1
        else:
            parts.append(str(steps[i]))
            i += 1
    every_one = len(parts) == len(steps)
    if len(parts) > SHOWN_STEPS:
        half = SHOWN_STEPS // 2
        parts, every_one = [*parts[:half], "...", *parts[-half:]], False
    text = ", ".join(parts)
    return text if every_one else f"{text} ({len(steps)} steps)"


def download_records(uri: str, run_id: str, split: str, step: int) -> list[RolloutRecord]:
    """The records of one logged step, read from a temporary copy of its ``.jsonl``.

    Raises:
        RolloutsError: the file is not a list of rollout records.

    """
    import mlflow

    from slca_exp.tracking.sweep_runs import no_progress_bar

    path = artifact_path(split, step, RECORDS)
    with tempfile.TemporaryDirectory(prefix="slca-rollouts-") as tmp, no_progress_bar():
        local = mlflow.artifacts.download_artifacts(
            run_id=run_id, artifact_path=path, dst_path=tmp, tracking_uri=uri
        )
        try:
            return list(read_records(Path(local)))
        except ValueError as err:
            raise RolloutsError(
                f"artifact {path} of run {run_id} is not a list of rollout records ({err}); "
                "was it written by another version of slca-exp?"
            ) from err


# -- printing -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Palette:
    """ANSI styles, or none (``Palette(False)``): every method returns its text styled."""

    on: bool

    @classmethod
    def for_stream(cls, stream: Any) -> Palette:  # noqa: ANN401 - a text stream
        """Colour when ``stream`` is a terminal and ``NO_COLOR`` is unset or empty."""
        tty = bool(getattr(stream, "isatty", lambda: False)())
        return cls(tty and not os.environ.get("NO_COLOR"))

    def _style(self, code: str, text: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.on else text

    def bold(self, text: str) -> str:
        """Bold."""
        return self._style("1", text)

    def dim(self, text: str) -> str:
        """Faint: what the update does not train on."""
        return self._style("2", text)

    def segment(self, segment: str, text: str) -> str:
        """The segment's colour: tool cyan, summary magenta, env faint."""
        codes = {"tool": "36", "summary": "35", "env": "2"}
        return self._style(codes.get(segment, "33"), text)

    def signed(self, value: float | None, text: str) -> str:
        """Green for a positive advantage, red for a negative one."""
        if value is None or value == 0:
            return text
        return self._style("32" if value > 0 else "31", text)


def render(record: RolloutRecord, palette: Palette) -> str:
    """One rollout as text: header, rewards, advantages, then the response turn by turn."""
    lines = [
        palette.bold(_header(record)),
        *_reward_lines(record),
        _advantage_line(record, palette),
        *_prompt_lines(record),
        *_response_lines(record, palette),
    ]
    return "\n".join(lines)


def _header(record: RolloutRecord) -> str:
    rank = record.rank or "unranked"
    return (
        f"━━ step {record.step} · {record.split} · group {record.group} · sample "
        f"{record.sample} · {rank} ━━"
    )


def _reward_lines(record: RolloutRecord) -> list[str]:
    rewards = record.rewards
    parts = " ".join(f"{k} {_num(rewards.components.get(k))}" for k in TOOL_COMPONENTS)
    extra = [k for k in rewards.components if k not in TOOL_COMPONENTS]
    parts += "".join(f" {k} {_num(rewards.components[k])}" for k in extra)
    rating = "—" if rewards.rating is None else f"{rewards.rating}/5"
    judge = f"judge {rewards.judge_status}"
    if rewards.judge_reason:
        judge += f": {_printable(rewards.judge_reason)}"
    no_call = " (gold makes no call)" if rewards.should_no_call else ""
    return [
        f"reward  tool {_num(rewards.tool)} ({parts}){no_call}",
        f"        summary {_num(rewards.summary)} (rating {rating}, {judge})",
        f"        total {_num(rewards.total)} (routed: tool {_num(rewards.routed_tool)}, "
        f"summary {_num(rewards.routed_summary)})",
    ]


def _advantage_line(record: RolloutRecord, palette: Palette) -> str:
    counts = {seg: record.segment_tokens(seg) for seg in ("tool", "summary", "env", "none")}
    if record.split == "val":
        adv = "A: — (validation: no update, no advantages)"
    else:
        tool, summary = record.tool_adv, record.summary_adv
        adv = (
            f"A: tool {palette.signed(tool, _signed(tool))}, "
            f"summary {palette.signed(summary, _signed(summary))}"
        )
    tokens = (
        f"tokens: tool {counts['tool']}, summary {counts['summary']}, env {counts['env']} "
        "(not trained)"
    )
    if counts["none"]:
        tokens += f", outside both segments {counts['none']}"
    return f"{adv} | {tokens}"


def _prompt_lines(record: RolloutRecord) -> list[str]:
    asked = [m for m in record.prompt if m.get("role") == "user"]
    if not asked:
        return []
    return [f"prompt  {_printable(str(asked[-1].get('content', '')))}"]


def _response_lines(record: RolloutRecord, palette: Palette) -> list[str]:
    lines: list[str] = []
    assistant = -1
    for turn in record.turns:
        lines.append(palette.segment(turn.segment, _marker(record, turn)))
        text = _printable(turn.text, keep_newlines=True)
        lines.append(palette.dim(text) if turn.role == "tool" else text)
        if turn.role == "assistant":
            assistant += 1
            lines += [_call_line(c) for c in record.calls if c.turn == assistant]
    if record.ends_on_tool_call:
        lines.append(palette.dim("(cut off: the last call was never answered; no summary)"))
    return lines


def _marker(record: RolloutRecord, turn: Turn) -> str:
    """``── tool segment (12 tokens, A=+0.800) ──`` above a turn."""
    if turn.role == "tool":
        return "── tool response (env, not trained) ──"
    if record.split == "val":
        adv = "A=— (validation)"
    elif turn.segment in ("tool", "summary"):
        adv = f"A={_signed(record.tool_adv if turn.segment == 'tool' else record.summary_adv)}"
    else:
        adv = "in neither segment"
    name = f"{turn.segment} segment" if turn.segment in ("tool", "summary") else "assistant turn"
    return f"── {name} ({turn.tokens} tokens, {adv}) ──"


def _call_line(call: Call) -> str:
    arguments = json.dumps(call.arguments, ensure_ascii=False)
    head = f"  ↳ call {_printable(call.name)}({_printable(arguments)})"
    answer = call.answer
    if answer is None:
        return f"{head}\n    no answer (nothing followed the call)"
    how = [answer.status or "status unknown"]
    if answer.reason:
        how.append(_printable(answer.reason))
    if answer.cached is not None:
        how.append("cached" if answer.cached else "not cached")
    return f"{head}\n    answer ({', '.join(how)}): {_printable(answer.content)}"


def _num(value: float | None) -> str:
    """``0.750``; ``—`` for a missing or not-a-number value."""
    if value is None or math.isnan(value):
        return "—"
    return f"{value:.3f}"


def _signed(value: float | None) -> str:
    """``+0.800`` / ``-0.500``; ``—`` when the segment has no advantage."""
    if value is None or math.isnan(value):
        return "—"
    return f"{value:+.3f}"


def _printable(text: str, *, keep_newlines: bool = False) -> str:
    r"""``text`` with control characters escaped (newlines kept when ``keep_newlines``).

    >>> _printable("a\x1b[31mb\nc")
    'a\\x1b[31mb\\nc'
    """
    if not keep_newlines:
        text = text.replace("\n", "\\n")
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group(0)):02x}", text)


# -- command line ---------------------------------------------------------------------------------


def main(argv: Sequence[str]) -> int:
    """Run ``slca-exp rollouts``; returns the exit status (0, or 2 when refused)."""
    try:
        args = _parser().parse_args(list(argv))
    except SystemExit as exit_:  # argparse has printed the usage and the reason (or the help)
        return int(exit_.code or 0)
    try:
        _check_html(args.html)
        return _show(args)
    except RolloutsError as err:
        print(f"{PREFIX}{err}", file=sys.stderr)
        return EXIT_REFUSED


def _show(args: argparse.Namespace) -> int:
    """Find the run and step, print the selected rollouts, write the credit view."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from slca_exp.tracking.uris import absolute_uri, default_tracking_uri

    uri = absolute_uri(args.tracking_uri) if args.tracking_uri else default_tracking_uri()
    _check_store(uri, explicit=bool(args.tracking_uri))
    split = "val" if args.val else "train"
    try:
        client = MlflowClient(tracking_uri=uri)
        run = find_run(client, args.run)
        label = _run_label(run)
        steps = logged_steps(client, run.info.run_id, split)
        if not steps:
            other = next(s for s in SPLITS if s != split)
            raise RolloutsError(
                no_rollouts_message(label, split, logged_steps(client, run.info.run_id, other))
            )
        step = choose_step(steps, args.step, split, label)
        records = download_records(uri, run.info.run_id, split, step)
    except MlflowException as err:
        raise RolloutsError(f"MLflow at {shown_uri(uri)}: {err.message}") from err
    rank = "best" if args.best else "worst" if args.worst else None
    selected = _select(records, rank, split, step)
    palette = Palette.for_stream(sys.stdout)
    print(palette.bold(_summary(label, split, step, steps, selected, rank)))
    for record in selected:
        print()
        print(render(record, palette))
    if args.html is not None:
        _write_html(args.html, selected, f"{label} · {split} step {step}")
    return EXIT_OK


def _select(
    records: list[RolloutRecord], rank: str | None, split: str, step: int
) -> list[RolloutRecord]:
    """The records ranked ``rank`` (all when None); refuses an empty selection."""
    if not records:
        raise RolloutsError(f"the {split} rollouts of step {step} are an empty file")
    if rank is None:
        return records
    chosen = [r for r in records if r.rank == rank]
    if not chosen:
        why = (
            "validation rollouts are not ranked (one per prompt)"
            if split == "val"
            else f"none of its {len(records)} rollouts is ranked {rank}"
        )
        raise RolloutsError(
            f"--{rank}: step {step} ({split}) has no {rank} rollout: {why}. Drop --{rank} to see "
            "them all."
        )
    return chosen


def _summary(
    label: str,
    split: str,
    step: int,
    steps: Sequence[int],
    selected: Sequence[RolloutRecord],
    rank: str | None,
) -> str:
    count = f"{len(selected)} rollout{'s' if len(selected) != 1 else ''}"
    which = f" ranked {rank}" if rank else ""
    return f"{label}: {split} step {step}, {count}{which} (logged steps: {compact_steps(steps)})"


def _run_label(run: Any) -> str:  # noqa: ANN401 - an mlflow Run
    name = run.info.run_name
    return f"run {name} ({run.info.run_id})" if name else f"run {run.info.run_id}"


def _describe(run: Any, experiments: dict[str, str]) -> str:  # noqa: ANN401 - an mlflow Run
    """``<id>  <name>  experiment <name>, started <time>`` for a list of runs."""
    experiment = experiments.get(run.info.experiment_id, run.info.experiment_id)
    started = (
        datetime.fromtimestamp(run.info.start_time / 1000).strftime("%Y-%m-%d %H:%M:%S")
        if run.info.start_time
        else "?"
    )
    name = run.info.run_name or "-"
    return f"{run.info.run_id}  {name}  experiment {experiment}, started {started}"


def _check_html(out: Path | None) -> None:
    """Refuse an ``--html`` file that cannot be written: before anything is downloaded."""
    if out is None:
        return
    if out.is_dir():
        raise RolloutsError(
            f"--html {out}: is a folder; give a file name, e.g. --html {out / 'rollouts.html'}"
        )
    if not out.parent.is_dir():
        raise RolloutsError(
            f"--html {out}: the folder {out.parent} does not exist; create it first or write "
            "the view elsewhere"
        )


def _write_html(out: Path, records: Sequence[RolloutRecord], title: str) -> None:
    from slca_exp.tracking.credit_view import render_credit_view

    out.write_text(render_credit_view(list(records), title=title), encoding="utf-8")
    print(f"\ncredit view: {out}")


def _check_store(uri: str, *, explicit: bool) -> None:
    """Refuse a local store that does not exist (MLflow would create an empty one).

    As ``slca-exp compare`` does (``compare._check_store``, a layer above this package).
    """
    from slca_exp.tracking.uris import local_store_path

    db = local_store_path(uri)
    if db is not None and not db.exists():
        how = "" if explicit else " (the default store; set SLCA_EXP_ROOT or pass --tracking-uri)"
        raise RolloutsError(f"no MLflow store at {db}{how}")


def _get_run(client: Any, run_id: str) -> Any | None:  # noqa: ANN401 - an mlflow Run
    try:
        return client.get_run(run_id)
    except Exception:  # not a run id of this store
        return None


def _looks_like_run_id(text: str) -> bool:
    return len(text) == 32 and all(c in "0123456789abcdef" for c in text)


def _step(text: str) -> int:
    """``--step``'s value: a step number (0 or more)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a step number: give the RL step as a whole number >= 0 (--step 10)"
        )
    return value


class _Parser(argparse.ArgumentParser):
    """argparse, its errors followed by where the flags are listed."""

    def error(self, message: str) -> NoReturn:
        """Exit 2 with ``message``, a hint for the two ranks, and where the flags are."""
        if "not allowed with argument" in message:
            message += " (pick one: --best shows each group's best rollout, --worst its worst)"
        super().error(f"{message}; slca-exp rollouts --help lists the flags")


def _parser() -> argparse.ArgumentParser:
    # Plain text: the module docstring's markup would reach the terminal as it is.
    parser = _Parser(
        prog="slca-exp rollouts",
        description="A run's logged rollouts in the terminal: per rollout its rewards, its two "
        "segment advantages and token counts, then the response turn by turn with segment "
        "markers and each tool call with its answer. Shows the last logged train step unless "
        "told otherwise; a run logs rollouts with tracking.rollouts.every=N (0: none).",
    )
    parser.add_argument("run", metavar="RUN", help="an MLflow run id, or a run name")
    parser.add_argument(
        "--step",
        type=_step,
        metavar="N",
        help="the logged step to show; default: the last one",
    )
    parser.add_argument(
        "--val",
        action="store_true",
        help="the validation rollouts (no advantages) instead of the training ones",
    )
    rank = parser.add_mutually_exclusive_group()
    rank.add_argument("--best", action="store_true", help="only each group's best rollout")
    rank.add_argument("--worst", action="store_true", help="only each group's worst rollout")
    parser.add_argument(
        "--html",
        type=Path,
        metavar="OUT",
        help="also write the selected rollouts' credit view (token-level advantages) to OUT",
    )
    parser.add_argument(
        "--tracking-uri",
        metavar="URI",
        help="MLflow tracking URI; default: the store slca-exp train logs to",
    )
    return parser
