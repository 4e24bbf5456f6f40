"""Serving a built-in backbone: ``service.model=builtin:<experiment>``.

A service normally serves a hub id or a folder. ``builtin:<experiment>`` serves instead the
built-in backbone that ``slca-exp train experiment=<experiment>`` builds: a tiny Qwen2 model
whose tokenizer is trained on that experiment's split and whose weights are initialised from
its seed. Nothing is downloaded; the service's job builds it on the node, the same way each
time, and keeps it under the registry (``<registry>/models``), where the next start finds it.
``builtin:verl_smoke`` is the backbone vLLM's CPU build serves in the tests and the docs (its
attention heads are 32 wide, a size vLLM's CPU attention runs).
"""

from __future__ import annotations

from pathlib import Path

from slca_exp.core.problems import ConfigError, Problem

PREFIX = "builtin:"
"""What ``service.model`` starts with to name an experiment's built-in backbone."""


def is_builtin(model: str) -> bool:
    """Whether ``service.model`` names a built-in backbone."""
    return model.startswith(PREFIX)


def builtin_problems(model: str) -> list[Problem]:
    """Whether ``builtin:<experiment>`` names an experiment whose backbone is built in.

    >>> [p.key for p in builtin_problems("builtin:no_such_experiment")]
    ['service.model']
    >>> builtin_problems("builtin:verl_smoke")
    []
    """
    try:
        _config(model, Path("."))
    except ConfigError as err:
        return [Problem("service.model", p.what, p.fix) for p in err.problems]
    return []


def build_builtin(model: str, root: Path) -> Path:
    """The folder of the built-in backbone ``model`` names, built under ``root`` if not there.

    Raises:
        ConfigError: the experiment does not compose, or its backbone is not a built-in one.

    """
    from slca_exp.data.splits import load_splits
    from slca_exp.engines.common import run_backbone

    config = _config(model, root)
    return Path(run_backbone(config, load_splits(config)).path)


def _config(model: str, root: Path):  # noqa: ANN202 - RunConfig
    from slca_exp.preflight.compose import compose_run
    from slca_exp.preflight.validate import validate

    experiment = model.removeprefix(PREFIX)
    try:
        config = validate(compose_run([f"experiment={experiment}", f"tracking.root={root}"]))
    except Exception as err:  # noqa: BLE001 - Hydra's missing option, or a ConfigError
        raise ConfigError(
            [
                Problem(
                    "service.model",
                    f"{model!r}: experiment={experiment} does not compose ({err})",
                    "name a shipped experiment: service.model=builtin:verl_smoke",
                )
            ]
        ) from None
    if config.backbone.source != "builtin":
        raise ConfigError(
            [
                Problem(
                    "service.model",
                    f"{model!r}: experiment={experiment} trains {config.backbone.name}, which is "
                    "not a built-in backbone",
                    "serve its checkpoint by hub id or folder: service.model=<id or folder>",
                )
            ]
        )
    return config
