"""``engine=verl``: the run config translated into a complete verl 0.9.x PPO trainer config.

    RunConfig (+ Recipe)
      -> verl's own ``ppo_trainer`` composed with Hydra from verl's packaged config folder
         (once per process, then copied)
      -> our values, one verl key each (:func:`verl_values`; :data:`SOURCES` names the key of
         ours each one comes from)
      -> ``engine.verl.overrides``, applied last with Hydra's override syntax
      == verl_config(config, recipe)                      (DictConfig, interpolations kept)
      -> check_verl_config(cfg): verl's own checks on CPU  (list[Problem], empty when valid)

The estimator is ``algorithm.adv_estimator = algorithm.name`` (``grpo`` is verl's own;
``slca_grpo`` and ``toolpo_grpo`` are registered by :mod:`slca_exp.engines.verl.plugin`, which
every Ray worker imports through ``VERL_USE_EXTERNAL_MODULES`` in
``ray_kwargs.ray_init.runtime_env.env_vars``). Our estimator hyper-parameters travel under
``algorithm.slca``: verl 0.9.1 hands the ``algorithm`` DictConfig to the estimator as it is and
never converts it to its ``AlgoConfig`` dataclass, so the extra mapping is safe. The agent loop
follows the estimator (:func:`agent_loop`): ours for ours (R_tool and R_sum at their segments'
ends), verl's own for ``grpo`` (the reward side's weighted total on the last token).

Composing needs only verl's YAML files (verl is found, not imported); checking
(:mod:`slca_exp.engines.verl.checks`) imports verl.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import importlib
import importlib.util
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from slca_exp.config.schema import RunConfig
from slca_exp.config.validate import ConfigError, Problem
from slca_exp.engines.verl import cpu
from slca_exp.recipe import Recipe

PLUGIN_MODULE = "slca_exp.engines.verl.plugin"
"""What every verl process must import (it registers our estimators)."""
MODULES_ENV = "VERL_USE_EXTERNAL_MODULES"
ENV_VARS_KEY = "ray_kwargs.ray_init.runtime_env.env_vars"
"""Where the Ray workers' environment variables go in verl's config."""
PARAMS_KEY = "algorithm.slca"
"""Our estimator hyper-parameters (``EstimatorParams`` fields, and ``mask_rule``)."""
CONFIG_FILE = "ppo_trainer.yaml"
TOOLS_FILE = "tools.yaml"
AGENT_LOOPS_FILE = "agent_loops.yaml"
ROLLOUT_LOG = "rollout_weights.jsonl"
"""``<run folder>/verl/rollout_weights.jsonl``: the cpu backend's weight updates of its server."""
BATCHES_DIR = "batches"
"""``<run folder>/verl/batches``: each step's batch (``engine.verl.dump_batches``)."""
DATA_DIR = "data"
"""``<run folder>/verl/data``: the splits as verl reads them (``extra_info.tools_kwargs`` added)."""
VERL_AGENT_LOOP = "tool_agent"
"""verl's own multi-turn tool agent loop (the one verl's own estimators get)."""
OUR_KEY = "slca_exp"
"""Top-level section with our reward, judge and simulator configs (read by the reward manager)."""

_ACTOR, _REF = "actor_rollout_ref.actor.", "actor_rollout_ref.ref."
_ROLLOUT, _TURNS = "actor_rollout_ref.rollout.", "actor_rollout_ref.rollout.multi_turn."

FIELD_KEYS: dict[str, tuple[str, ...]] = {
    "nnodes": ("trainer.nnodes",),
    "n_gpus_per_node": ("trainer.n_gpus_per_node",),
    "strategy": (_ACTOR + "strategy",),
    "train_batch_size": ("data.train_batch_size",),
    "ppo_mini_batch_size": (_ACTOR + "ppo_mini_batch_size",),
    "ppo_micro_batch_size_per_gpu": (_ACTOR + "ppo_micro_batch_size_per_gpu",),
    "log_prob_micro_batch_size_per_gpu": (
        _ROLLOUT + "log_prob_micro_batch_size_per_gpu",
        _REF + "log_prob_micro_batch_size_per_gpu",
    ),
    "max_prompt_length": ("data.max_prompt_length",),
    "max_response_length": ("data.max_response_length",),
    "tensor_model_parallel_size": (_ROLLOUT + "tensor_model_parallel_size",),
    "gpu_memory_utilization": (_ROLLOUT + "gpu_memory_utilization",),
    "temperature": (_ROLLOUT + "temperature",),
    "max_assistant_turns": (_TURNS + "max_assistant_turns",),
    "max_parallel_calls": (_TURNS + "max_parallel_calls",),
    "lr": (_ACTOR + "optim.lr",),
    "use_kl_loss": (_ACTOR + "use_kl_loss",),
    "kl_loss_coef": (_ACTOR + "kl_loss_coef", "algorithm.kl_ctrl.kl_coef"),
    "kl_loss_type": (_ACTOR + "kl_loss_type", "algorithm.kl_penalty"),
    "use_kl_in_reward": ("algorithm.use_kl_in_reward",),
    "total_epochs": ("trainer.total_epochs",),
    "total_training_steps": ("trainer.total_training_steps",),
    "save_freq": ("trainer.save_freq",),
    "test_freq": ("trainer.test_freq",),
}
"""``engine.verl.<field>`` -> the verl keys it sets (``mask_rule``: ``algorithm.slca``)."""

SOURCES: dict[str, str] = {
    **{key: "engine.verl.backend (cpu)" for key in cpu.KEYS},
    **{key: f"engine.verl.{field}" for field, keys in FIELD_KEYS.items() for key in keys},
    "actor_rollout_ref.model.path": "backbone.path",
    "actor_rollout_ref.model.custom_chat_template": "backbone.chat_template",
    _ROLLOUT + "n": "algorithm.group_size",
    _ROLLOUT + "seed": "seed",
    _ACTOR + "data_loader_seed": "seed",
    "data.train_files": "data.files.train (its copy with tools_kwargs)",
    "data.val_files": "data.files.val (its copy with tools_kwargs)",
    "data.seed": "data.seed",
    "algorithm.adv_estimator": "algorithm.name",
    _ROLLOUT + "agent.default_agent_loop": "algorithm.name (the loop its scores need)",
    "algorithm.norm_adv_by_std_in_grpo": "algorithm.norm_by_std",
    PARAMS_KEY: "algorithm.* and engine.verl.mask_rule",
    PARAMS_KEY + ".mask_rule": "engine.verl.mask_rule",
    "trainer.logger": "tracking.backends",
    "trainer.project_name": "tracking.wandb_project, else experiment_name",
    "trainer.experiment_name": "run_name",
}
"""verl key -> the key of ours it is translated from (a problem's fix names it)."""

FIXED: dict[str, Any] = {
    _ROLLOUT + "name": "vllm",
    _TURNS + "enable": True,
    _TURNS + "format": "hermes",
    # HierR + the judge, per trajectory (slca_exp/engines/verl/rewards.py)
    "reward.reward_manager.source": "importlib",
    "reward.reward_manager.name": "SLCARewardManager",
    "reward.reward_manager.module.path": "pkg://slca_exp.engines.verl.rewards",
    "critic.enable": False,  # GRPO-family estimators: no value model
    # verl's synchronous trainer plus our per-segment metrics and the corrected mask rule
    # (slca_exp/engines/verl/trainer.py, registered by the plugin)
    "trainer.v1.trainer_mode": "slca_sync",
}
"""verl values every translated config has."""


def verl_config(config: RunConfig, recipe: Recipe | None = None) -> DictConfig:
    """The complete verl PPO trainer config of a run.

    Args:
        config: the validated run config (``engine.verl`` holds the verl settings).
        recipe: its recipe, when built: the data files it checked and the trackers' run name.

    Returns:
        verl's composed ``ppo_trainer`` with our values, then ``engine.verl.overrides``; verl's
        own interpolations are kept (its TaskRunner resolves them).

    Raises:
        ConfigError: verl is not installed, the backbone cannot run on verl, or an override is
            bad (each problem names its key).

    """
    return translated(
        config,
        Path(CONFIG_FILE).stem,
        verl_values(config, recipe),
        config.engine.verl.overrides,
        "engine.verl.overrides",
        new_keys=(PARAMS_KEY, ENV_VARS_KEY, OUR_KEY, *cpu.NEW_KEYS),
    )


def translated(
    config: RunConfig,
    name: str,
    values: dict[str, Any],
    overrides: list[str],
    where: str,
    *,
    new_keys: tuple[str, ...] = (),
) -> DictConfig:
    """Verl's config ``name`` composed, with ``values`` set, then ``overrides`` applied.

    Args:
        config: the run config (its backbone must be a checkpoint verl can load).
        name: verl's config (``ppo_trainer``, ``sft_trainer_engine``).
        values: verl key -> our value; each key must be verl's, except ``new_keys``.
        overrides: raw verl overrides (Hydra syntax), applied last.
        where: the key of ours that holds ``overrides`` (problems name ``where[i]``).
        new_keys: keys of ours added to verl's config.

    Raises:
        ConfigError: verl is not installed, the backbone is builtin, or overrides are bad.

    """
    if config.backbone.source != "builtin" and not config.backbone.path:
        raise ConfigError(
            [
                Problem(
                    "backbone.path",
                    "engine=verl loads a Hugging Face checkpoint and the backbone names none",
                    "pick a hub or local backbone, e.g. backbone=qwen2.5-7b-instruct, or the "
                    "built-in backbone=tiny",
                )
            ]
        )
    cfg = copy.deepcopy(compose_verl(str(verl_config_dir()), name))
    with open_dict(cfg):
        for key, value in values.items():
            new = key in new_keys
            if not (new or has_key(cfg, key)):  # our own table must use verl's names exactly
                raise KeyError(f"{key!r} is not a key of verl's {name} config")
            OmegaConf.update(cfg, key, value, merge=False, force_add=new)
    problems = [
        problem
        for i, text in enumerate(overrides)
        if (problem := apply_override(cfg, text, f"{where}[{i}]")) is not None
    ]
    if problems:
        raise ConfigError(problems)
    return cfg


def verl_values(config: RunConfig, recipe: Recipe | None = None) -> dict[str, Any]:
    """Our values by verl key: :data:`FIELD_KEYS`, :data:`SOURCES`, :data:`FIXED` and the rest."""
    v = config.engine.verl
    folder = verl_dir(config)
    train, val = _data_files(config, recipe)
    values = {key: getattr(v, field) for field, keys in FIELD_KEYS.items() for key in keys}
    values.update(FIXED)
    values.update(
        {
            "actor_rollout_ref.model.path": model_path(config, recipe),
            "actor_rollout_ref.model.custom_chat_template": chat_template(config),
            _ROLLOUT + "n": config.algorithm.group_size,
            _ROLLOUT + "seed": config.seed,
            _ACTOR + "data_loader_seed": config.seed,
            # Written into the run folder with this config (write_side_files); not read here.
            _TURNS + "tool_config_path": str(folder / TOOLS_FILE),
            _ROLLOUT + "agent.agent_loop_config_path": str(folder / AGENT_LOOPS_FILE),
            OUR_KEY: {
                **our_section(config),
                "data": {"train": train, "val": val},
                "dump_dir": str(folder / BATCHES_DIR) if v.dump_batches else None,
            },
            "data.train_files": str(folder / DATA_DIR / "train.parquet") if train else None,
            "data.val_files": str(folder / DATA_DIR / "val.parquet") if val else None,
            "data.seed": config.data.seed,
            "algorithm.adv_estimator": config.algorithm.name,  # grpo: verl's; ours: the plugin
            _ROLLOUT + "agent.default_agent_loop": agent_loop(config.algorithm.name),
            "algorithm.norm_adv_by_std_in_grpo": config.algorithm.norm_by_std,
            PARAMS_KEY: {**estimator_params(config), "mask_rule": v.mask_rule},
            "trainer.logger": list(config.tracking.backends),  # verl has the same three names
            # verl's W&B logger opens this project (MLflow attaches to our run by its id)
            "trainer.project_name": config.tracking.wandb_project or config.experiment_name,
            "trainer.experiment_name": run_name_of(config, recipe),
            "trainer.default_local_dir": str(folder / "checkpoints"),
            ENV_VARS_KEY: worker_env(config),
        }
    )
    if backend_of(config) == "cpu":
        uses_ref = v.use_kl_loss or v.use_kl_in_reward
        values.update(cpu.verl_values(uses_ref))
        values.update(cpu.new_values(uses_ref, v.n_gpus_per_node))
    return values


def backend_of(config: RunConfig) -> str:
    """``engine.verl.backend`` resolved: ``auto`` is ``cuda`` when this host has a GPU."""
    backend = config.engine.verl.backend
    if backend != "auto":
        return backend
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def model_path(config: RunConfig, recipe: Recipe | None = None) -> str:
    """The checkpoint verl loads: ``backbone.path``, or the built-in backbone's cached folder.

    The built-in (``backbone=tiny``) is built as the local engine builds it, from the run's
    splits (its tokenizer is trained on them), and saved as an ordinary HF checkpoint under
    the tracking root's cache; the same inputs reuse the folder.
    """
    if config.backbone.source != "builtin":
        return str(config.backbone.path)
    from slca_exp.preflight import may_create
    from slca_exp.tracking.mlflow import output_root

    if not may_create():  # a check that only looks (validate, --dry-run): build nothing
        return f"<built at launch under {output_root(config.tracking) / 'cache' / 'backbones'}>"
    from slca_exp.backbones import load_backbone
    from slca_exp.data.splits import load_splits
    from slca_exp.engines.local.data_io import corpus

    splits = load_splits(config)
    built = load_backbone(
        config.backbone,
        corpus=lambda: corpus(splits),
        cache_root=output_root(config.tracking) / "cache",
        seed=config.seed,
    )
    return str(built.path)


def agent_loop(estimator: str) -> str:
    """The agent loop verl runs for ``estimator`` (``actor_rollout_ref.rollout.agent``).

    Ours (:data:`slca_exp.engines.verl.rewards.AGENT_NAME`, listed in the agent-loop config
    written next to the verl config: :data:`AGENT_LOOPS_FILE`) puts R_tool and R_sum at their
    segments' ends, which our estimators read; an estimator of verl's (``grpo``) gets verl's own
    multi-turn loop, :data:`VERL_AGENT_LOOP`, which puts the reward side's total (weighted as
    ``reward.*`` says, or the penalty) on the last response token, as verl's estimators expect.
    """
    from slca_exp.engines.verl.estimators import NAMES
    from slca_exp.engines.verl.rewards import AGENT_NAME

    return AGENT_NAME if estimator in NAMES else VERL_AGENT_LOOP


def our_section(config: RunConfig) -> dict[str, Any]:
    """What the verl config carries under :data:`OUR_KEY` for the reward workers and tools.

    verl logs its whole config as MLflow params, this section included, so it goes through the
    run's redactor: secrets reach the workers through the environment (``api_key_env``) only.
    """
    from slca_exp.tracking.redact import Redactor

    redactor = Redactor.for_config(config)
    return {
        name: redactor.mapping(
            OmegaConf.to_container(OmegaConf.structured(getattr(config, name)), resolve=True)
        )
        for name in ("reward", "judge", "simulator")
    }


def write_side_files(
    config: RunConfig, cfg: DictConfig, *, require_data: bool = False
) -> list[Path]:
    """Write the agent-loop config and, when the splits are here, the data copies and tool config.

    Everything goes where ``cfg`` points verl (``<run folder>/verl``). The tool config needs the
    train split's tool schemas, and the copies are the splits (``slca_exp.data`` of ``cfg``) with
    ``extra_info.tools_kwargs`` added: for data that lives only on the cluster they are written
    at launch.

    Args:
        config: the run config.
        cfg: its translated verl config.
        require_data: a split that is not here is an error (at launch) instead of skipped.

    Raises:
        ConfigError: ``require_data`` and a split file is missing (the key is named).

    """
    from slca_exp.engines.verl.rewards import agent_loop_config
    from slca_exp.engines.verl.tools import schemas_of, write_tool_config, write_verl_split

    written = [agent_loop_config(OmegaConf.select(cfg, _ROLLOUT + "agent.agent_loop_config_path"))]
    sources = OmegaConf.select(cfg, OUR_KEY + ".data", default=None) or {}
    rows: dict[str, list[dict[str, Any]]] = {}
    for split, target in (("train", "data.train_files"), ("val", "data.val_files")):
        source = sources.get(split)
        if not source or not OmegaConf.select(cfg, target):
            continue
        if not Path(source).is_file():
            if require_data:
                raise ConfigError(
                    [problem(f"data.files.{split}", f"{source} is not a file here", "fix the path")]
                )
            continue
        import pyarrow.parquet as pq

        rows[split] = pq.read_table(source).to_pylist()
    if "train" not in rows:
        return written
    schemas = schemas_of(rows["train"])
    names = [schema["function"]["name"] for schema in schemas]
    tools = OmegaConf.select(cfg, _TURNS + "tool_config_path")
    written.append(write_tool_config(tools, rows["train"], config.simulator))
    for split, target in (("train", "data.train_files"), ("val", "data.val_files")):
        if split in rows:
            written.append(write_verl_split(rows[split], names, OmegaConf.select(cfg, target)))
    return written


def estimator_params(config: RunConfig) -> dict[str, Any]:
    """Our ``EstimatorParams`` fields from ``algorithm``: what ``algorithm.slca`` holds."""
    from slca_exp.estimators import EstimatorParams

    return {f.name: getattr(config.algorithm, f.name) for f in dataclasses.fields(EstimatorParams)}


def worker_env(config: RunConfig) -> dict[str, str]:
    """Environment variables of every Ray worker (``ray_kwargs.ray_init.runtime_env.env_vars``).

    ``VERL_USE_EXTERNAL_MODULES`` names our plugin (after any module this process's
    environment already names); ``SLCA_EXP_PLUGINS`` travels when set; verl's own MLflow and
    W&B loggers are pointed where ours write.
    """
    from slca_exp.plugins import PLUGINS_ENV

    modules = [m.strip() for m in os.environ.get(MODULES_ENV, "").split(",") if m.strip()]
    env: dict[str, str] = {}
    if backend_of(config) == "cpu":  # the platform first: later modules ask verl for it
        modules = [cpu.PLATFORM_MODULE, *modules]
        env.update(cpu.WORKER_ENV)
        env.update(cpu.thread_env())
        env[cpu.ROLLOUT_LOG_ENV] = str(verl_dir(config) / ROLLOUT_LOG)
    env[MODULES_ENV] = ",".join(dict.fromkeys([*modules, PLUGIN_MODULE]))
    if os.environ.get(PLUGINS_ENV):
        env[PLUGINS_ENV] = os.environ[PLUGINS_ENV]
    if "mlflow" in config.tracking.backends:
        from slca_exp.tracking.mlflow import store_uri

        env["MLFLOW_TRACKING_URI"] = store_uri(config.tracking)
    if "wandb" in config.tracking.backends:
        env["WANDB_MODE"] = config.tracking.wandb_mode
    return env


def verl_dir(config: RunConfig) -> Path:
    """``<run folder>/verl``: the translated config, the tool config, verl's checkpoints."""
    from slca_exp.engines.local.state import run_dir

    return run_dir(config) / "verl"


def write_verl_config(cfg: DictConfig, path: str | Path) -> Path:
    """Write ``cfg`` as YAML (interpolations kept), creating its folder; returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(OmegaConf.to_yaml(cfg))
    return path


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


def _data_files(config: RunConfig, recipe: Recipe | None) -> tuple[str | None, str | None]:
    """Train and val files: the recipe's checked paths, else where the config puts them.

    Without a recipe nothing is read or generated (the Toucan files live on the cluster).
    """
    if recipe is not None and recipe.data.get("files"):
        files = recipe.data["files"]
        return (files.get("train") or {}).get("path"), (files.get("val") or {}).get("path")
    d = config.data
    if d.kind == "synthetic":
        from slca_exp.data.splits import SPLIT_FILES, synthetic_dir

        folder = synthetic_dir(config)
        return str(folder / SPLIT_FILES["train"]), str(folder / SPLIT_FILES["val"])
    base = Path(d.dir).expanduser() if d.dir else Path.cwd()  # as data/splits.py resolves them
    train, val = (str((base / f).resolve()) if f else None for f in (d.files.train, d.files.val))
    return train, val


def chat_template(config: RunConfig) -> str | None:
    """The template's text (verl's ``custom_chat_template`` takes the template, not a path)."""
    path = config.backbone.chat_template
    if not path:
        return None
    try:
        return Path(path).read_text()
    except OSError as err:
        raise ConfigError(
            [Problem("backbone.chat_template", f"cannot read {path!r}: {err}", "fix the path")]
        ) from None


def run_name_of(config: RunConfig, recipe: Recipe | None) -> str:
    """The trackers' run name (``tracking/build.py``); without a recipe, the run folder's key."""
    if recipe is not None:
        from slca_exp.tracking.build import run_name
        from slca_exp.tracking.redact import Redactor

        return run_name(config, recipe, Redactor.for_config(config))
    if config.run_name:
        return config.run_name
    from slca_exp.engines.local.state import run_key

    return f"{config.algorithm.name}-{run_key(config)}"


# --- engine.verl.overrides ---------------------------------------------------------------------


def apply_override(cfg: DictConfig, text: str, where: str) -> Problem | None:
    """Apply one verl value override with Hydra's semantics; a problem instead of raising."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        (override,) = OverridesParser.create().parse_overrides([text])
    except HydraException as err:
        return Problem(where, f"{text!r} is not an override: {first_line(err)}", _SYNTAX)
    key = override.key_or_group
    if override.package is not None or "/" in key or key in _verl_groups():
        return Problem(
            where,
            f"{text!r} picks a verl config group; only values can be overridden here",
            "set the values you need one by one, e.g. actor_rollout_ref.actor.clip_ratio=0.2",
        )
    if override.is_sweep_override():
        return Problem(where, f"{text!r} is a sweep", "sweep our keys with -m; one value here")
    exists = has_key(cfg, key)
    try:
        with open_dict(cfg):
            if override.is_delete() and exists:
                parent, _, leaf = key.rpartition(".")
                del (OmegaConf.select(cfg, parent) if parent else cfg)[leaf]
            elif override.is_add() and exists:
                return Problem(where, f"verl already has {key}", f"write {key}=<value>")
            elif not exists and not (override.is_add() or override.is_force_add()):
                return _not_a_key(cfg, key, where, override.is_delete())
            else:
                OmegaConf.update(cfg, key, override.value(), merge=True, force_add=True)
    except (OmegaConfBaseException, ValueError) as err:
        return Problem(where, f"{text!r}: {first_line(err)}", _SYNTAX)
    return None


_SYNTAX = "write key=value, +key=value (a new key), ++key=value or ~key with verl's key names"


def _not_a_key(cfg: DictConfig, key: str, where: str, delete: bool) -> Problem:
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, default=None) if parent else cfg
    close = difflib.get_close_matches(leaf, list(node), n=1) if isinstance(node, DictConfig) else []
    hint = f"did you mean {parent + '.' if parent else ''}{close[0]}? " if close else ""
    return Problem(
        where,
        f"verl's config has no key {key!r}",
        f"{hint}use verl's key names (verl/trainer/config/*.yaml)"
        + ("" if delete else f", or +{key}=... to add one"),
    )


@functools.lru_cache(maxsize=1)
def _verl_groups() -> frozenset[str]:
    return frozenset(p.name for p in verl_config_dir().iterdir() if p.is_dir() and p.name[0] != "_")


ALSO = {
    "data.train_batch_size": "algorithm.group_size, engine.verl.nnodes and n_gpus_per_node",
    _ROLLOUT + "tensor_model_parallel_size": "engine.verl.nnodes and n_gpus_per_node",
    _ACTOR + "ppo_mini_batch_size": "algorithm.group_size, engine.verl.nnodes and n_gpus_per_node",
}
"""Keys of ours that take part in the check of a verl key besides its own source."""


def first_line(err: BaseException) -> str:
    """The first non-blank line of an error's message (its type's name when there is none)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__


def unresolved(
    cfg: DictConfig, problem_on: Callable[[str, str], Problem], unused: tuple[str, ...] = ()
) -> list[Problem]:
    """Keys of ``cfg`` left at ``???`` or whose interpolation fails (``cfg`` is resolved).

    Args:
        cfg: a translated config, resolved in place when nothing is missing.
        problem_on: (verl key, what is wrong) -> the problem, naming our key.
        unused: key prefixes verl never reads with these settings (their ``???`` is fine).

    Returns:
        Every key with no value; else the first interpolation that fails; else ``[]``.

    """
    try:  # missing_keys, too, reads every value: a broken interpolation fails there first
        missing = [
            problem_on(key, "has no value (???)")
            for key in sorted(OmegaConf.missing_keys(cfg))
            if not key.startswith(unused)
        ]
        if not missing:
            OmegaConf.resolve(cfg)
    except OmegaConfBaseException as err:
        return [problem_on(str(getattr(err, "full_key", "") or "<verl config>"), first_line(err))]
    return missing


def problem(key: str, what: str, fix: str = "") -> Problem:
    """A problem on verl key ``key`` of the RL config (see :func:`keyed_problem`)."""
    return keyed_problem(key, what, fix)


def keyed_problem(
    key: str,
    what: str,
    fix: str = "",
    *,
    sources: Mapping[str, str] = SOURCES,
    fixed: Mapping[str, Any] = FIXED,
    overrides: str = "engine.verl.overrides",
    also: Mapping[str, str] = ALSO,
) -> Problem:
    """A problem on verl key ``key``; the fix names the key of ours it is translated from.

    Args:
        key: verl's key (``trainer.logger[1]`` comes from ``trainer.logger``).
        what: what is wrong.
        fix: how to fix it in verl's terms (our key is appended).
        sources: verl key -> our key (:data:`SOURCES`, or the SFT table).
        fixed: the values slca-exp always sets.
        overrides: where raw verl overrides of that config go.
        also: keys of ours that take part besides the source.

    """
    key_of = re.sub(r"\[\d+\]$", "", key)
    if key_of in sources:
        with_ = f" (with {also[key_of]})" if key_of in also else ""
        where = f"change {sources[key_of]}{with_}"
    elif key_of in fixed:
        where = f"slca-exp always sets {key_of}={fixed[key_of]}; override it in {overrides}"
    else:
        where = f"set it in {overrides}"
    return Problem(key, what, f"{fix}; {where}" if fix else where)
