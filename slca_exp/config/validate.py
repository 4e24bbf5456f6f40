"""Validation of a composed config: every problem at once, each with its full key and the fix.

Three passes over the composed ``DictConfig``:

1. structure: keys the schema does not know (typos, or keys added with ``+``), values left
   missing (``???``);
2. field checks declared beside each field in ``schema.py`` (ranges, choices);
3. cross-field checks below (tool weights summing to 1, an HTTP judge needing a model, ...).

Type errors are caught earlier, when values are merged onto the schema (``compose.py``).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import typing
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from slca_exp.config.fields import check_of
from slca_exp.config.schema import RunConfig


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a config.

    Attributes:
        key: full dotted key, e.g. ``algorithm.eps``.
        what: what is wrong.
        fix: how to fix it.

    """

    key: str
    what: str
    fix: str

    def __str__(self) -> str:
        return f"{self.key}: {self.what}\n    fix: {self.fix}"


class ConfigError(Exception):
    """A config with problems; ``str(err)`` lists all of them."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__(problems)
        self.problems = problems

    def __str__(self) -> str:
        n = len(self.problems)
        head = f"the recipe is invalid ({n} problem{'s' if n != 1 else ''}):"
        return "\n".join([head, *(f"  {p}".replace("\n", "\n  ") for p in self.problems)])


def problems_of(cfg: DictConfig) -> list[Problem]:
    """Every problem of a composed config (empty when it is valid)."""
    problems: list[Problem] = []
    _walk(cfg, RunConfig, "", problems)
    broken = {p.key.split(".")[0] for p in problems}
    for section, check in _CROSS_CHECKS.items():
        if section not in broken and section in cfg:
            problems.extend(check(cfg[section]))
    if not broken & {"engine", "algorithm"} and "engine" in cfg and "algorithm" in cfg:
        problems.extend(_check_minibatches(cfg))
    return problems


def validate(cfg: DictConfig) -> RunConfig:
    """Return the typed :class:`RunConfig` of a composed config.

    Raises:
        ConfigError: listing every problem found.

    """
    problems = problems_of(cfg)
    if problems:
        raise ConfigError(problems)
    plain = OmegaConf.to_container(cfg, resolve=True)
    config = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(RunConfig), plain))
    _rescale_tool_weights(config)
    return config


def _rescale_tool_weights(config: RunConfig) -> None:
    """Rescale the tool weights to sum to 1 when ``reward.normalize`` is set.

    The typed config, hence the recorded recipe, then carries the rescaled values.
    """
    weights = config.reward.tool_weights
    if not config.reward.normalize:
        return
    names = [f.name for f in dataclasses.fields(weights)]
    total = sum(getattr(weights, name) for name in names)
    for name in names:
        setattr(weights, name, getattr(weights, name) / total)


def field_names(schema: type) -> list[str]:
    """Names of the fields of a dataclass schema."""
    return [f.name for f in dataclasses.fields(schema)]


def unknown_key_problem(key: str, schema: type, depth: int | None = None) -> Problem:
    """The problem for a key whose part at ``depth`` the ``schema`` (its parent's) lacks.

    Args:
        key: the full dotted key as the user wrote it.
        schema: the dataclass of the parent of the unknown part.
        depth: index of the unknown part in ``key`` (default: the last part).

    Example:
        >>> from slca_exp.config.schema import RewardConfig
        >>> unknown_key_problem("reward.tool_weight.name", RewardConfig, 1).fix.split(".")[:3]
        ['did you mean reward', 'tool_weights', 'name? Otherwise remove it']

    """
    parts = key.split(".")
    depth = len(parts) - 1 if depth is None else depth
    parent, leaf, tail = ".".join(parts[:depth]), parts[depth], parts[depth + 1 :]
    known = field_names(schema)
    close = difflib.get_close_matches(leaf, known, n=1)
    stem = f"{parent}." if parent else ""
    rest = "".join(f".{t}" for t in tail)
    hint = f"did you mean {stem}{close[0]}{rest}? Otherwise remove it. " if close else "remove it. "
    return Problem(
        key,
        f"unknown key (the schema of {parent or 'the top level'} has no {leaf!r})",
        f"{hint}Known keys{f' of {parent}' if parent else ''}: {', '.join(known)}",
    )


def unknown_path_problem(key: str, root: type = RunConfig) -> Problem:
    """The problem for a dotted key that is not in the schema, at whatever depth it goes wrong.

    ``reward.tool_weight.name`` is answered at ``tool_weight`` (did you mean
    ``reward.tool_weights.name``?), not at its last part.
    """
    parts = key.split(".")
    schema = root
    for depth, part in enumerate(parts):
        if part not in field_names(schema):
            return unknown_key_problem(key, schema, depth)
        sub = _dataclass_in(typing.get_type_hints(schema)[part])
        if sub is None:
            head = ".".join(parts[: depth + 1])
            return Problem(
                key,
                f"{head} is a single value ({user_type(typing.get_type_hints(schema)[part])}), "
                "it has no keys",
                f"set {head}=<value>",
            )
        schema = sub
    return Problem(key, "unknown key", f"check the spelling of {key}")


def user_type(hint: Any) -> str:  # noqa: ANN401 - a type hint
    """A type as a user writes its values, not as Python names it.

    Example:
        >>> from slca_exp.config.schema import ToolWeights
        >>> user_type(ToolWeights)
        'a mapping of weights (format, name, key, value, parallel)'
        >>> user_type(float | None), user_type(list[str])
        ('a number, or null', 'a list (written [a,b])')

    """
    args = typing.get_args(hint)
    if type(None) in args:
        inner = [a for a in args if a is not type(None)]
        return f"{' or '.join(user_type(a) for a in inner)}, or null"
    if dataclasses.is_dataclass(hint):
        names = field_names(hint)  # type: ignore[arg-type]
        floats = all(t is float for t in typing.get_type_hints(hint).values())
        return f"a mapping of {'weights' if floats else 'keys'} ({', '.join(names)})"
    origin = typing.get_origin(hint)
    if origin in (list, tuple) or hint in (list, tuple):
        return "a list (written [a,b])"
    if origin is dict or hint is dict:
        return "a mapping, e.g. {a: 1}"
    names = {bool: "true or false", int: "a whole number", float: "a number", str: "a string"}
    return names.get(hint, getattr(hint, "__name__", str(hint)))


def _walk(node: DictConfig, schema: type, prefix: str, problems: list[Problem]) -> None:
    fields = {f.name: f for f in dataclasses.fields(schema)}
    hints = typing.get_type_hints(schema)
    for key in node:
        full = f"{prefix}{key}"
        if key not in fields:
            problems.append(unknown_key_problem(full, schema))
            continue
        if OmegaConf.is_missing(node, key):
            problems.append(Problem(full, "has no value (???)", f"set it: {full}=<value>"))
            continue
        value = node[key]
        sub = _dataclass_in(hints[key])
        if isinstance(value, DictConfig) and sub is not None:
            _walk(value, sub, f"{full}.", problems)
            continue
        check = check_of(schema, key)
        if check is None:
            continue
        for item in value if isinstance(value, ListConfig) else [value]:
            found = check.problem(item)
            if found:
                default = fields[key].default
                example = "" if default is dataclasses.MISSING else f" (default: {full}={default})"
                problems.append(Problem(full, found[0], found[1] + example))


def schema_at(dotted: str) -> type | None:
    """The dataclass schema at a dotted path (``""`` = the whole run), if there is one."""
    node: type | None = RunConfig
    for part in filter(None, dotted.split(".")):
        if node is None:
            return None
        hint = typing.get_type_hints(node).get(part)
        node = _dataclass_in(hint) if hint is not None else None
    return node


def _dataclass_in(hint: Any) -> type | None:  # noqa: ANN401
    """The dataclass a type hint names (``X`` or ``X | None``), if any."""
    for candidate in typing.get_args(hint) or (hint,):
        if dataclasses.is_dataclass(candidate):
            return candidate  # type: ignore[return-value]
    return None


# --- cross-field checks ---------------------------------------------------------------------

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _check_reward(reward: DictConfig) -> list[Problem]:
    weights = reward.tool_weights
    total = sum(float(weights[k]) for k in weights)
    if reward.normalize:
        if total <= 0:
            return [
                Problem(
                    "reward.tool_weights",
                    "normalize=true needs at least one positive tool weight (they sum to 0)",
                    "give some weight a positive value",
                )
            ]
        return []
    if not math.isclose(total, 1.0, abs_tol=1e-6):
        return [
            Problem(
                "reward.tool_weights",
                f"the five tool weights must sum to 1 (they sum to {total:g})",
                "adjust them, or set reward.normalize=true to rescale (the rescaled weights "
                "are recorded)",
            )
        ]
    return []


LOCAL_BACKENDS = {"judge": "rubric", "simulator": "replay"}
"""The backend of each service group that runs in-process (no server, no URL)."""

_SECRET_QUERY = re.compile(
    r"[?&](?P<name>[^=&#]*(?:key|token|secret|passw(?:or)?d|sig(?:nature)?|auth)[^=&#]*)=",
    re.IGNORECASE,
)


def url_credentials(url: str) -> str | None:
    """What in ``url`` is a credential (``user:password@``, ``?api_key=...``), or ``None``.

    Example:
        >>> url_credentials("http://u:secret@host/v1"), url_credentials("http://host/v1?token=x")
        ('user:password@', 'the query parameter token')
        >>> url_credentials("http://127.0.0.1:8000/v1") is None
        True

    """
    match = _URI.match(url)
    if match is not None and match.group("auth"):
        return "user:password@"
    query = _SECRET_QUERY.search(url)
    return f"the query parameter {query.group('name')}" if query else None


def _check_service(group: str) -> Any:  # noqa: ANN401
    local = LOCAL_BACKENDS[group]

    def check(service: DictConfig) -> list[Problem]:
        problems = []
        key_env = service.api_key_env
        if key_env and not _ENV_NAME.fullmatch(str(key_env)):
            problems.append(
                Problem(
                    f"{group}.api_key_env",
                    "must be the NAME of an environment variable holding the key, not the key",
                    f"export the key as e.g. MY_API_KEY and set {group}.api_key_env=MY_API_KEY",
                )
            )
        if service.prompt:
            from slca_exp.services.prompts import resolve_prompt, shipped_prompts

            if resolve_prompt(str(service.prompt), group) is None:
                shipped = ", ".join(shipped_prompts(group)) or "(none)"
                problems.append(
                    Problem(
                        f"{group}.prompt",
                        f"no prompt template {service.prompt!r}: neither a file nor a template "
                        f"shipped in slca_exp/{group}s/prompts/",
                        f"give the path of a template file, or one of: {shipped}",
                    )
                )
        url = str(service.base_url or "")  # checked whatever the backend: it is recorded
        secret = url_credentials(url) if url else None
        if secret is not None:
            problems.append(
                Problem(
                    f"{group}.base_url",
                    f"carries credentials ({secret}); configs are recorded, secrets must not be",
                    f"remove them from the URL, export the key as e.g. MY_API_KEY and set "
                    f"{group}.api_key_env=MY_API_KEY (it is sent as Authorization: Bearer)",
                )
            )
        if service.backend == local:
            return problems
        for key, example in (("model", "my-model"), ("base_url", "http://127.0.0.1:8000/v1")):
            if not service[key]:
                problems.append(
                    Problem(
                        f"{group}.{key}",
                        f"{group}.backend={service.backend} talks to a served model and needs "
                        f"{group}.{key}",
                        f"set {group}.{key}={example}, or use {group}.backend={local}",
                    )
                )
        if url and not url.startswith(("http://", "https://")):
            problems.append(
                Problem(
                    f"{group}.base_url",
                    f"must be an http:// or https:// URL of an OpenAI-compatible API (got {url!r})",
                    f"set {group}.base_url=http://<host>:<port>/v1",
                )
            )
        return problems

    return check


def _check_backbone(backbone: DictConfig) -> list[Problem]:
    from slca_exp.backbones.tiny import MIN_VOCAB

    if backbone.source in ("hf", "local") and not backbone.path:
        return [
            Problem(
                "backbone.path",
                f"backbone.source={backbone.source} needs the hub id or folder of the weights",
                "set backbone.path=<hub id or folder>",
            )
        ]
    if backbone.source != "builtin":
        return []
    arch = backbone.arch
    if arch is None:
        return [
            Problem(
                "backbone.arch",
                "backbone.source=builtin builds a model from scratch and needs its architecture",
                "set backbone.arch (see conf/backbone/tiny.yaml) or use backbone=tiny",
            )
        ]
    problems = []
    if arch.hidden_size % arch.num_heads or (arch.hidden_size // arch.num_heads) % 2:
        problems.append(
            Problem(
                "backbone.arch.num_heads",
                f"hidden_size={arch.hidden_size} / num_heads={arch.num_heads} is not an even "
                "whole head size (rotary embeddings rotate pairs of channels)",
                "pick num_heads so that hidden_size / num_heads is even, e.g. 64 / 4",
            )
        )
    if arch.vocab_size < MIN_VOCAB:
        problems.append(
            Problem(
                "backbone.arch.vocab_size",
                f"{arch.vocab_size} cannot hold the 3 special tokens, 256 byte symbols and 6 tags",
                f"set backbone.arch.vocab_size to at least {MIN_VOCAB} (tiny.yaml uses 1024)",
            )
        )
    return problems


def _check_data(data: DictConfig) -> list[Problem]:
    roles = ("sft", "train", "val")
    if data.kind == "synthetic":
        # The generator names its files itself (sft/train/val.parquet, a contract with engines).
        return [
            Problem(
                f"data.files.{role}",
                "data.kind=synthetic writes sft.parquet, train.parquet and val.parquet itself",
                f"remove data.files.{role}, or set data.kind=files to read your own files",
            )
            for role in roles
            if data.files[role]
        ]
    if not (data.files.train and data.files.val):
        return [
            Problem(
                "data.files",
                "data.kind=files needs at least data.files.train and data.files.val",
                "set data.files.train=<parquet> data.files.val=<parquet> (and data.files.sft)",
            )
        ]
    return []


def _check_algorithm(algorithm: DictConfig) -> list[Problem]:
    from slca_exp.estimators import ESTIMATORS

    if algorithm.name not in ESTIMATORS:
        return [
            Problem(
                "algorithm.name",
                ESTIMATORS.unknown_message(algorithm.name),
                "pick a registered estimator, e.g. algorithm=slca_grpo",
            )
        ]
    return []


_URI = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*):(?://(?P<auth>[^/@]*@)?)?")


def _check_tracking(tracking: DictConfig) -> list[Problem]:
    allowed = ("mlflow", "wandb", "console")
    problems = [
        Problem(
            f"tracking.backends[{i}]",
            f"unknown tracker {name!r}",
            f"use any of: {', '.join(allowed)}",
        )
        for i, name in enumerate(tracking.backends)
        if name not in allowed
    ]
    seen = [name for name in tracking.backends if name in allowed]
    if len(set(seen)) < len(seen):
        problems.append(
            Problem("tracking.backends", "lists a tracker twice", "name each tracker once")
        )
    uri = tracking.get("mlflow_uri")
    if uri:
        match = _URI.match(str(uri))
        if match is None:
            problems.append(
                Problem(
                    "tracking.mlflow_uri",
                    f"{uri!r} is not a URI (no scheme)",
                    "give e.g. http://127.0.0.1:5000 or sqlite:////abs/path/mlflow.db, or null "
                    "for the default store under tracking.root",
                )
            )
        elif (secret := url_credentials(str(uri))) is not None:
            problems.append(
                Problem(
                    "tracking.mlflow_uri",
                    f"carries credentials ({secret}); configs are recorded, secrets must not be",
                    "remove them from the URI and export MLFLOW_TRACKING_USERNAME and "
                    "MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) instead",
                )
            )
    return problems


def _check_engine(engine: DictConfig) -> list[Problem]:
    from slca_exp.engines import ENGINES

    if engine.name not in ENGINES:
        return [
            Problem(
                "engine.name",
                ENGINES.unknown_message(engine.name),
                "pick an installed engine, e.g. engine=local (plugins add theirs through "
                "SLCA_EXP_PLUGINS)",
            )
        ]
    rollout = engine.rollout
    if rollout.max_response_tokens < rollout.max_turn_tokens:
        return [
            Problem(
                "engine.rollout.max_response_tokens",
                f"{rollout.max_response_tokens} tokens cannot hold even one assistant turn "
                f"(engine.rollout.max_turn_tokens={rollout.max_turn_tokens})",
                "raise engine.rollout.max_response_tokens to at least "
                "engine.rollout.max_turn_tokens (a tool call, its response and a reply need "
                "about three turns' worth)",
            )
        ]
    if not (engine.sft.enabled or engine.rl.enabled):
        return [
            Problem(
                "engine.rl.enabled",
                "both stages are off (engine.sft.enabled=false, engine.rl.enabled=false)",
                "enable at least one stage",
            )
        ]
    return []


def _check_minibatches(cfg: DictConfig) -> list[Problem]:
    """The local engine splits a step's rollouts into minibatches: it needs a rollout for each."""
    engine = cfg.engine
    if engine.name != "local" or not engine.rl.enabled:
        return []
    prompts, group = engine.rollout.prompts_per_step, cfg.algorithm.group_size
    rollouts, wanted = prompts * group, engine.rl.minibatches
    if wanted <= rollouts:
        return []
    return [
        Problem(
            "engine.rl.minibatches",
            f"{wanted} minibatches cannot be filled from the {rollouts} rollouts of an RL step "
            f"(engine.rollout.prompts_per_step={prompts} x algorithm.group_size={group})",
            f"set engine.rl.minibatches to at most {rollouts}, or roll out more per step "
            "(engine.rollout.prompts_per_step, algorithm.group_size)",
        )
    ]


_CROSS_CHECKS = {
    "backbone": _check_backbone,
    "reward": _check_reward,
    "judge": _check_service("judge"),
    "simulator": _check_service("simulator"),
    "data": _check_data,
    "algorithm": _check_algorithm,
    "engine": _check_engine,
    "tracking": _check_tracking,
}
