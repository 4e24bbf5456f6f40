"""``slca-exp``: the command line.

    slca-exp train [HYDRA FLAGS] [OVERRIDES]     run (or with --cfg job, print) a recipe
    slca-exp validate [HYDRA FLAGS] [OVERRIDES]  compose and validate, report every problem
    slca-exp compare EXPERIMENT_OR_SWEEP [--metric M ...] [--strict] [--tracking-uri URI]
                     [--out DIR] [--ui-url URL]  table, plots and MLflow compare link of a sweep
    slca-exp data synth --out DIR [--rows N] [--seed S]  write the seeded synthetic split

train and validate accept Hydra's own flags (``--config-dir``, ``--config-name``, ``-m``,
``--cfg``) and overrides. A bad recipe exits with status 2 and one message listing every problem,
before Hydra creates anything (no output folder, no run, no job). ``slca-exp compare --help``
describes compare.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from slca_exp.config.compose import CONFIG_NAME, check_overrides, expand_sweeps
from slca_exp.config.validate import ConfigError
from slca_exp.plugins import load_plugins

USAGE = __doc__.split("\n\n")[1]

EXIT_BAD_CONFIG = 2


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(f"usage:\n{USAGE}")
        return 0
    command, rest = args[0], args[1:]
    if command in ("train", "validate"):
        try:
            load_plugins()
        except ConfigError as err:
            print(f"slca-exp: {err}", file=sys.stderr)
            return EXIT_BAD_CONFIG
    if command == "validate":
        return _validate(rest)
    if command == "train":
        return _train(rest)
    if command == "compare":
        from slca_exp.compare import main as compare

        return compare(rest)
    if command == "data":
        from slca_exp.data.cli import main as data

        return data(rest)
    print(f"slca-exp: unknown command {command!r}\nusage:\n{USAGE}", file=sys.stderr)
    return EXIT_BAD_CONFIG


def _parse(rest: list[str]):  # noqa: ANN202 - argparse.Namespace from Hydra's own parser
    # Hydra's own parser, so that both commands take exactly Hydra's flags (hydra-core is pinned
    # below 1.4, where this module lives).
    from hydra._internal.utils import get_args_parser

    return get_args_parser().parse_args(rest)


def _check(args) -> int:  # noqa: ANN001 - argparse.Namespace
    """Validate every job; print the problems and return 0 (valid) or 2."""
    jobs, problems = check_overrides(
        args.overrides,
        config_name=args.config_name or CONFIG_NAME,
        extra_config_dirs=[args.config_dir] if args.config_dir else [],
    )
    if problems:
        print(f"slca-exp: {ConfigError(problems)}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    return 0 if jobs else EXIT_BAD_CONFIG


def _validate(rest: list[str]) -> int:
    args = _parse(rest)
    status = _check(args)
    if status == 0:
        jobs = len(expand_sweeps(args.overrides))
        print(f"slca-exp: the recipe is valid ({jobs} job{'s' if jobs != 1 else ''})")
    return status


def _train(rest: list[str]) -> int:
    args = _parse(rest)
    informational = args.help or args.hydra_help or args.shell_completion or args.info
    # With --config-path the primary config is not ours to pre-check; the task validates it.
    if not (informational or args.config_path):
        status = _check(args)
        if status:
            return status
    from slca_exp import train

    if not (informational or args.config_path or args.cfg):
        # The recipe (data files, prompts) and the engine, for every job, before Hydra creates
        # an output folder or a tracker opens a run.
        status = train.check_jobs(
            args.overrides,
            config_name=args.config_name or CONFIG_NAME,
            extra_config_dirs=[args.config_dir] if args.config_dir else [],
        )
        if status:
            return status
    sys.argv = ["slca-exp", *rest]
    train.main()
    return 0


def entry() -> None:
    """Console-script entry point."""
    sys.exit(main())


if __name__ == "__main__":
    entry()
