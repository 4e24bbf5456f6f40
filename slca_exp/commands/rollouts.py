"""``slca-exp rollouts``: a run's logged rollouts in the terminal, segment by segment.

    slca-exp rollouts RUN [--step N] [--val] [--best | --worst] [--html OUT] [--tracking-uri URI]
    slca-exp rollouts RUN_A --against RUN_B [--val] [--step N] [--best | --worst]

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

With ``--against RUN_B`` the same split of a second run is read (its last logged step, or
``--step N`` in both) and the rollouts of the same prompt pair up (``rollouts/pairing.py``): per
prompt both runs' calls, summaries and rewards and ``B - A``, the most changed first, then the
mean change and how many prompts B is ahead on.

Colour (ANSI) is used only when stdout is a terminal and ``NO_COLOR`` is unset or empty
(no-color.org); piped or redirected output is plain text. Text a model wrote is printed with its
control characters escaped, so a rollout cannot drive the terminal. Every refusal (an unknown
run, an ambiguous name, a step that was not logged, a run without rollouts, bad flags) exits
with status 2 and a message on stderr that names what to pass instead.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from slca_exp.core.problems import EXIT_BAD_CONFIG
from slca_exp.core.shown import compact, shown_uri
from slca_exp.rollouts.record import SPLITS, RolloutRecord
from slca_exp.tracking import readback
from slca_exp.tracking.rollout_text import Palette, render

PREFIX = "slca-exp rollouts: "
EVERY_SETTING = "tracking.rollouts.every"
"""The setting that makes a run log rollouts (0: none)."""


class RolloutsError(Exception):
    """A user-facing refusal (a step not logged, bad flags, ...): exit status 2."""


def main(argv: Sequence[str]) -> int:
    """Run ``slca-exp rollouts``; returns the exit status (0, or 2 when refused)."""
    try:
        args = _parser().parse_args(list(argv))
    except SystemExit as exit_:  # argparse has printed the usage and the reason (or the help)
        return int(exit_.code or 0)
    try:
        _check_html(args.html)
        if args.against is not None:
            return _against(args)
        return _show(args)
    except (RolloutsError, readback.ReadbackError) as err:
        print(f"{PREFIX}{err}", file=sys.stderr)
        return EXIT_BAD_CONFIG


def _show(args: argparse.Namespace) -> int:
    """Find the run and step, print the selected rollouts, write the credit view."""
    split = "val" if args.val else "train"
    ((label, steps, step, records),) = _read_runs(args, [args.run], split)
    rank = "best" if args.best else "worst" if args.worst else None
    selected = _select(records, rank, split, step)
    palette = Palette.for_stream(sys.stdout)
    print(palette.bold(_summary(label, split, step, steps, selected, rank)))
    for record in selected:
        print()
        print(render(record, palette))
    if args.html is not None:
        _write_html(args.html, selected, f"{label} · {split} step {step}")
    return 0


def _read_runs(
    args: argparse.Namespace, targets: Sequence[str], split: str
) -> list[tuple[str, list[int], int, list[RolloutRecord]]]:
    """Per target run (in the store ``--tracking-uri`` names): :func:`_read`'s four parts."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from slca_exp.tracking.uris import absolute_uri, default_tracking_uri

    uri = absolute_uri(args.tracking_uri) if args.tracking_uri else default_tracking_uri()
    readback.check_store(uri, explicit=bool(args.tracking_uri))
    try:
        client = MlflowClient(tracking_uri=uri)
        return [_read(client, uri, target, split, args.step) for target in targets]
    except MlflowException as err:
        raise RolloutsError(f"MLflow at {shown_uri(uri)}: {err.message}") from err


def _read(
    client: Any,  # noqa: ANN401 - an MlflowClient
    uri: str,
    target: str,
    split: str,
    wanted: int | None,
) -> tuple[str, list[int], int, list[RolloutRecord]]:
    """(run label, logged steps, the step, its records) of one run's ``split`` rollouts."""
    run = readback.find_run(client, target)
    label = _run_label(run)
    steps = readback.logged_steps(client, run.info.run_id, split)
    if not steps:
        other = next(s for s in SPLITS if s != split)
        raise RolloutsError(
            no_rollouts_message(label, split, readback.logged_steps(client, run.info.run_id, other))
        )
    step = choose_step(steps, wanted, split, label)
    return label, steps, step, readback.download_records(uri, run.info.run_id, split, step)


def _against(args: argparse.Namespace) -> int:
    """Pair two runs' rollouts of the same prompts and print them side by side."""
    from slca_exp.rollouts.pairing import pair_rollouts
    from slca_exp.tracking.rollout_text import render_pair

    if args.html is not None:
        raise RolloutsError("--html shows one run's rollouts: drop --against, or drop --html")
    split = "val" if args.val else "train"
    (label_a, _, step_a, a), (label_b, _, step_b, b) = _read_runs(
        args, [args.run, args.against], split
    )
    rank = "best" if args.best else "worst" if args.worst else None
    a = _select(a, rank, split, step_a)
    b = _select(b, rank, split, step_b)
    pairing = pair_rollouts(a, b)
    palette = Palette.for_stream(sys.stdout)
    print(palette.bold(f"A: {label_a}, {split} step {step_a}"))
    print(palette.bold(f"B: {label_b}, {split} step {step_b}"))
    if not pairing.pairs:
        raise RolloutsError(_unpaired(pairing, split))
    for pair in pairing.pairs:
        print()
        print(render_pair(pair, palette))
    print()
    print(_pairing_summary(pairing, split))
    return 0


def _pairing_summary(pairing: Any, split: str) -> str:  # noqa: ANN401 - a Pairing
    from slca_exp.tracking.rollout_text import signed_number

    n = len(pairing.pairs)
    means = ", ".join(
        f"{name} {signed_number(pairing.mean_delta(name))}" for name in ("tool", "summary", "total")
    )
    ahead, behind, level = pairing.counts()
    lines = [
        f"{n} {split} prompt{'s' if n != 1 else ''} paired. Mean B - A: {means}. "
        f"By the total, B is ahead on {ahead}, behind on {behind}, level on {level}."
    ]
    for what, keys in (
        ("only in A", pairing.only_a),
        ("only in B", pairing.only_b),
        ("the same id with a different prompt (not paired)", pairing.different_prompt),
    ):
        if keys:
            lines.append(f"{what}: {', '.join(keys)}")
    return "\n".join(lines)


def _unpaired(pairing: Any, split: str) -> str:  # noqa: ANN401 - a Pairing
    if pairing.different_prompt:
        return (
            f"no {split} rollout of the two runs shows the same prompt: their prompt ids match "
            f"({', '.join(pairing.different_prompt[:4])}) but the questions differ, so the runs "
            "used different data (data.seed, data.rows or data=). Pair runs of one sweep's seed."
        )
    return (
        f"the two runs logged no {split} rollout of the same prompt (A: "
        f"{', '.join(pairing.only_a[:4]) or 'none'}; B: {', '.join(pairing.only_b[:4]) or 'none'})"
        + (
            ". Training rollouts pair only where both runs logged the same group: try --val"
            if split == "train"
            else ""
        )
    )


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
    return f"{label}: {split} step {step}, {count}{which} (logged steps: {compact(steps, 'steps')})"


def _run_label(run: Any) -> str:  # noqa: ANN401 - an mlflow Run
    name = run.info.run_name
    return f"run {name} ({run.info.run_id})" if name else f"run {run.info.run_id}"


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
        "--against",
        metavar="RUN_B",
        help="a second run: pair the rollouts of the same prompts (the same split and step) "
        "and print both, their rewards and B - A, the most changed first",
    )
    parser.add_argument(
        "--tracking-uri",
        metavar="URI",
        help="MLflow tracking URI; default: the store slca-exp train logs to",
    )
    return parser


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
            f"logged {split} steps: {compact(steps, 'steps')}. Pass one of them, or omit --step "
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
            f"{other} rollouts at steps {compact(others, 'steps')}: {flag}."
        )
    return (
        f"{run_label} logged no rollouts (its rollouts/train/ and rollouts/val/ artifact folders "
        f"are empty). A run logs them with {EVERY_SETTING}=N (the first RL step, every N-th and "
        f"every validation; {EVERY_SETTING}=0 turns them off): was it 0, or did the run stop "
        "before its first logged step?"
    )
