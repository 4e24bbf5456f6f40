"""``slca-exp``: the command line.

    slca-exp train [--dry-run] [HYDRA FLAGS] [OVERRIDES]  run (or with --cfg job, print) a recipe
    slca-exp validate [HYDRA FLAGS] [OVERRIDES]  compose and validate, report every problem
    slca-exp compare EXPERIMENT_OR_SWEEP [--metric M ...] [--strict] [--tracking-uri URI]
                     [--out DIR] [--ui-url URL]  table, plots and MLflow compare link of a sweep
    slca-exp data synth --out DIR [--rows N] [--seed S]  write the seeded synthetic split

train and validate accept Hydra's own flags (``--config-dir``, ``--config-name``, ``-m``,
``--cfg``) and overrides. A bad recipe exits with status 2 and one message listing every problem,
before Hydra creates anything (no output folder, no run, no job). ``slca-exp compare --help``
describes compare.

Two more overrides are the CLI's own (``slca_exp/launch/command.py``): ``launcher=<profile>``
(plus ``launcher.<key>=<value>``) picks a cluster profile from launchers/, ``sweep=<study>`` a
ready study from sweeps/ (with ``-m``). ``train --dry-run`` checks every job's config, then
prints the jobs, the resources and the sbatch script, and submits and creates nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from slca_exp.config.compose import CONFIG_NAME, compose_jobs, expand_sweeps
from slca_exp.config.validate import ConfigError, Problem
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


def _unfold(rest: list[str]):  # noqa: ANN202 - (argparse.Namespace, list[str], Plan)
    """Parse ``rest`` and unfold its ``sweep=`` and ``launcher=``; returns the new ``rest`` too."""
    from slca_exp.launch.command import plan

    args = _parse(rest)
    unfolded = plan(args.overrides, [args.config_dir] if args.config_dir else [])
    if unfolded.overrides != args.overrides:
        flags = list(rest)
        for override in args.overrides:  # the overrides are the positional arguments
            flags.remove(override)
        rest = flags + unfolded.overrides
        args = _parse(rest)
    return args, rest, unfolded


def _check(args, found: Sequence[Problem] = ()) -> tuple[int, list]:  # noqa: ANN001
    """Validate every job; print the problems (``found`` first).

    Returns:
        ``(0, the jobs' composed configs)`` when every job is valid, else ``(2, [])``.

    """
    jobs, cfgs, problems = compose_jobs(
        args.overrides,
        config_name=args.config_name or CONFIG_NAME,
        extra_config_dirs=[args.config_dir] if args.config_dir else [],
    )
    problems = [*found, *problems]
    if problems:
        print(f"slca-exp: {ConfigError(problems)}", file=sys.stderr)
        return EXIT_BAD_CONFIG, []
    return (0, cfgs) if jobs else (EXIT_BAD_CONFIG, [])


def _validate(rest: list[str]) -> int:
    args, _, unfolded = _unfold(rest)
    status, _ = _check(args, unfolded.problems)
    if status == 0:
        jobs = len(expand_sweeps(args.overrides))
        print(f"slca-exp: the recipe is valid ({jobs} job{'s' if jobs != 1 else ''})")
    return status


def _train(rest: list[str]) -> int:
    dry_run = "--dry-run" in rest
    rest = [a for a in rest if a != "--dry-run"]
    args, rest, unfolded = _unfold(rest)
    if unfolded.study and not args.multirun:
        print(f"slca-exp: sweep={unfolded.study} is a sweep: add -m", file=sys.stderr)
        return EXIT_BAD_CONFIG
    if unfolded.profile is not None and unfolded.profile.kind != "basic" and not args.multirun:
        # Hydra runs a single job here whatever the launcher; a profile that submits makes the
        # job a sweep of one, so `train launcher=slurm_cpu` goes to the cluster.
        rest = ["-m", *rest]
        args = _parse(rest)
    informational = args.help or args.hydra_help or args.shell_completion or args.info
    # With --config-path the primary config is not ours to pre-check; the task validates it.
    cfgs: list = []
    verl_jobs: list = []  # engine=verl: its verl config is shown (--cfg) or written (--dry-run)
    if not (informational or args.config_path):
        if args.cfg or dry_run:
            status, cfgs, verl_jobs = _check_showing_verl(args, unfolded.problems)
        else:
            status, cfgs = _check(args, unfolded.problems)
        if status:
            return status
    elif unfolded.problems:
        print(f"slca-exp: {ConfigError(unfolded.problems)}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    from slca_exp import train

    # A dry run checks every job's config only: building the recipe may write the data cache.
    if not (informational or args.config_path or args.cfg or dry_run):
        # The recipe (data files, prompts) and the engine, for every job, before Hydra creates
        # an output folder or a tracker opens a run.
        status = train.check_jobs(cfgs)
        if status:
            return status
    if dry_run:
        from slca_exp.launch.dry_run import describe

        if verl_jobs and (status := _verl_configs(verl_jobs, write=True)):
            return status

        print(describe(unfolded.launcher, unfolded.profile, expand_sweeps(args.overrides)))
        return 0
    sys.argv = ["slca-exp", *rest]
    train.main()
    if args.cfg and verl_jobs:
        return _verl_configs(verl_jobs, write=False)
    return 0


# --- engine=verl: `train --cfg job` shows, `train --dry-run` checks and writes the verl config ---


def _check_showing_verl(args, found: Sequence[Problem]) -> tuple[int, list, list]:  # noqa: ANN001
    """:func:`_check`, plus the typed configs of the ``engine=verl`` jobs (to show or write).

    Returns:
        ``(0 or 2, the jobs' composed configs, the typed configs of the verl jobs)``.

    """
    from slca_exp.config.validate import validate

    status, cfgs = _check(args, found)
    if status:
        return status, [], []
    return 0, cfgs, [validate(cfg) for cfg in cfgs if cfg.engine.name == "verl"]


def _verl_configs(configs: list, *, write: bool) -> int:
    """Print (``--cfg``) or check and write (``--dry-run``) each verl job's translated configs.

    The RL config (``ppo_trainer.yaml`` and its side files) and, when ``engine.sft.enabled``,
    the SFT config (``sft_trainer.yaml``).

    Returns:
        0, or 2 after naming every problem (verl's own validation included); then nothing is
        written.

    """
    from omegaconf import OmegaConf

    from slca_exp.engines.verl import config as verl
    from slca_exp.engines.verl import sft
    from slca_exp.engines.verl.checks import check_verl_config

    translated, problems = [], []
    for config in configs:
        try:
            cfg = verl.verl_config(config)
            sft_cfg = sft.sft_config(config) if config.engine.sft.enabled else None
        except ConfigError as err:
            problems += err.problems
            continue
        if write:
            problems += check_verl_config(cfg)
            problems += sft.check_sft_config(sft_cfg) if sft_cfg is not None else []
        translated.append((config, cfg, sft_cfg))
    if problems:
        print(f"slca-exp: {ConfigError(problems)}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    for config, cfg, sft_cfg in translated:
        folder = verl.verl_dir(config)
        if write:
            path = verl.write_verl_config(cfg, folder / verl.CONFIG_FILE)
            print(f"slca-exp: verl config checked and written to {path}")
            for side in verl.write_side_files(config, cfg):
                print(f"slca-exp: and {side}")
            if sft_cfg is not None:
                path = verl.write_verl_config(sft_cfg, folder / sft.CONFIG_FILE)
                print(f"slca-exp: verl SFT config checked and written to {path}")
        else:
            print(f"# engine=verl: the translated verl config ({verl.CONFIG_FILE} + ours)")
            print(OmegaConf.to_yaml(cfg))
            if sft_cfg is not None:
                print(f"# engine=verl: the translated verl SFT config ({sft.CONFIG_FILE})")
                print(OmegaConf.to_yaml(sft_cfg))
    return 0


def entry() -> None:
    """Console-script entry point."""
    sys.exit(main())


if __name__ == "__main__":
    entry()
