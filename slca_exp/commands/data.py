"""``slca-exp data ...``: data commands.

    slca-exp data synth --out DIR [--rows N] [--seed S]

``synth`` writes the synthetic split (``sft.parquet``, ``train.parquet``, ``val.parquet`` and a
``manifest.json``) into DIR, checks every row, and prints each file with its row count and
sha256. Bad arguments exit with status 2.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from slca_exp.core.problems import EXIT_BAD_CONFIG


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    # Plain text: the module docstring's markup would reach the terminal as it is.
    parser = argparse.ArgumentParser(
        prog="slca-exp data", description="Data commands: synth writes the seeded synthetic split."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    synth = commands.add_parser(
        "synth",
        help="write the seeded synthetic split",
        description="Write sft.parquet, train.parquet and val.parquet (train = sft = N rows, "
        "val = max(16, N // 4)); the same N and S give the same bytes under the same pyarrow.",
    )
    synth.add_argument("--out", required=True, metavar="DIR", help="output folder")
    synth.add_argument(
        "--rows", type=_positive, default=256, metavar="N", help="RL train rows (default 256)"
    )
    synth.add_argument("--seed", type=int, default=42, metavar="S", help="data seed (default 42)")
    return parser


def main(argv: Sequence[str]) -> int:
    """Run ``slca-exp data``; returns the exit status (2 for bad arguments)."""
    try:
        args = _parser().parse_args(list(argv))
    except SystemExit as exit_:  # argparse has printed the usage and the reason
        return int(exit_.code or 0)
    return _synth(args.out, args.rows, args.seed)


def _synth(out: str, rows: int, seed: int) -> int:
    from slca_exp.data.splits import DataError, load_split
    from slca_exp.data.synthetic import SyntheticFolderError, generate

    start = time.perf_counter()
    try:
        paths = generate(out, rows, seed)
        splits = [load_split(path, name) for name, path in paths.items()]
    except (SyntheticFolderError, DataError) as err:
        print(f"slca-exp data synth: {err}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    except OSError as err:
        print(f"slca-exp data synth: cannot write to --out {out!r}: {err}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    seconds = time.perf_counter() - start
    for split in splits:
        print(f"{split.name:5s} {split.num_rows:6d} rows  sha256 {split.sha256}  {split.path}")
    print(f"slca-exp data synth: rows={rows} seed={seed} in {seconds:.2f}s")
    return 0
