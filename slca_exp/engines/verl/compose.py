"""verl's packaged trainer configs, found without importing verl and composed with Hydra.

    verl_config_dir()                      <verl install>/trainer/config (verl found, not imported)
      -> compose_verl(dir, name)           verl's ``ppo_trainer`` or ``sft_trainer_engine`` as its
                                           ``hydra.main`` composes it (cached per process: copy it)
      -> has_key(cfg, key), verl_groups()  what the translation and the overrides check against

A Hydra app may be running when a config is composed (the train task): Hydra's global state is
put back afterwards.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from slca_exp.core.problems import ConfigError, Problem
from slca_exp.engines.verl.keys import CONFIG_FILE


def verl_config_dir() -> Path:
    """The trainer config folder verl ships (found without importing verl).

    Raises:
        ConfigError: verl is not installed.

    """
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            [
                Problem(
                    "engine.name",
                    "engine=verl needs verl 0.9.x installed in this environment",
                    "pip install 'slca-exp[verl]' (CPU) or 'slca-exp[gpu]' (clusters)",
                )
            ]
        )
    return Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config"


@functools.lru_cache(maxsize=4)
def compose_verl(config_dir: str, name: str = Path(CONFIG_FILE).stem) -> DictConfig:
    """Compose one of verl's trainer configs as its ``hydra.main`` does (cached: copy it).

    Args:
        config_dir: verl's packaged config folder (:func:`verl_config_dir`).
        name: the config: ``ppo_trainer`` (RL) or ``sft_trainer_engine`` (SFT).

    A Hydra app may be running (the train task): its global state is put back afterwards.

    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.initialize import get_gh_backup, restore_gh_from_backup

    backup = get_gh_backup()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir, job_name="slca-exp-verl", version_base="1.3"):
            return compose(config_name=name)
    finally:
        restore_gh_from_backup(backup)


def has_key(cfg: DictConfig, key: str) -> bool:
    """Whether ``key`` is in ``cfg``, a missing (``???``) value included."""
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, default=None) if parent else cfg
    return isinstance(node, DictConfig) and leaf in node.keys()  # noqa: SIM118 - keys() has ???


@functools.lru_cache(maxsize=1)
def verl_groups() -> frozenset[str]:
    """The config groups verl ships (``actor``, ``rollout``, ...): overrides may not pick one."""
    return frozenset(p.name for p in verl_config_dir().iterdir() if p.is_dir() and p.name[0] != "_")
