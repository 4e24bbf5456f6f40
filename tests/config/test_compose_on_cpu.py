"""Composition and validation of the config tree."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from slca_exp.config.schema import GROUPS, RunConfig
from slca_exp.engines import ENGINES
from slca_exp.preflight.compose import CONFIG_DIR, check_overrides, compose_run, expand_sweeps
from slca_exp.preflight.validate import ConfigError, validate


def options(group):
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


def problems(*overrides, **kw):
    return check_overrides(list(overrides), **kw)[1]


def test_default_recipe_is_valid_and_typed():
    cfg = compose_run([])
    run = validate(cfg)
    assert isinstance(run, RunConfig)
    assert run.algorithm.name == "slca_grpo" and run.reward.variant == "strict"
    assert run.backbone.arch is not None and run.backbone.arch.num_layers == 2


@pytest.mark.parametrize(
    ("group", "option"),
    [(g, o) for g in GROUPS for o in options(g)]
    + [("experiment", o) for o in options("experiment")],
)
def test_every_option_of_every_group_composes_and_validates(group, option):
    # judge=served / simulator=served is the model of a named service: it needs the name
    named = [f"{group}.service=a_service"] if option == "served" else []
    config = validate(compose_run([f"{group}={option}", *named]))
    assert config.engine.name in ENGINES


def test_every_group_has_an_option_and_a_schema():
    assert set(GROUPS) == {
        "backbone",
        "reward",
        "judge",
        "simulator",
        "data",
        "algorithm",
        "engine",
        "tracking",
    }
    for group in GROUPS:
        assert options(group), group
    assert options("algorithm") == ["grpo", "slca_grpo", "toolpo_grpo"]


def test_experiment_is_a_delta_applied_last():
    cfg = compose_run(["experiment=grpo_baseline"])
    assert cfg.algorithm.name == "grpo" and cfg.experiment_name == "grpo-baseline"
    assert compose_run(["experiment=smoke", "algorithm.group_size=6"]).algorithm.group_size == 6


def test_all_problems_reported_at_once_with_full_keys():
    found = problems("algorithm=slca_grpo", "algorithm.eps=-1", "+algorithm.bogus=3")
    assert [p.key for p in found] == ["algorithm.eps", "algorithm.bogus"]
    assert "> 0" in found[0].what and "unknown key" in found[1].what
    assert "eps" in found[1].fix  # lists the known keys


def test_type_errors_and_typos_are_collected_too():
    found = problems(
        "algorithm.eps=abc", "algorithm.epz=3", "seed=x", "+top=1", "reward.tool_weights.name=0.5"
    )
    keys = [p.key for p in found]
    assert keys == ["algorithm.eps", "algorithm.epz", "seed", "top", "reward.tool_weights"]
    assert "did you mean algorithm.eps" in found[1].fix
    assert "sum to 1" in found[4].what


def test_unknown_option_names_the_group_and_lists_options():
    (found,) = problems("algorithm=slca")
    assert found.key == "algorithm" and "grpo, slca_grpo, toolpo_grpo" in found.fix


def test_cross_field_checks():
    keys = {
        p.key
        for p in problems(
            "judge.backend=openai",
            "simulator.backend=sgls",
            "simulator.model=m",
            "data.kind=files",
            "backbone.source=hf",
            "tracking.backends=[mlflow,foo]",
        )
    }
    assert keys == {
        "judge.model",
        "judge.base_url",
        "simulator.base_url",
        "data.files",
        "backbone.path",
        "tracking.backends[1]",
    }
    assert not problems("reward.tool_weights.name=0.5", "reward.normalize=true")
    assert problems("judge.api_key_env=sk-123-secret")[0].key == "judge.api_key_env"


def test_choices_and_ranges():
    keys = [
        p.key
        for p in problems(
            "reward.variant=loose",
            "algorithm.group_size=1",
            "reward.tool_weights.key=-0.1",
            "engine.device=tpu",
            "reward.no_call_penalty=nan",
        )
    ]
    assert keys == [
        "reward.variant",
        "reward.tool_weights.key",
        "reward.no_call_penalty",
        "algorithm.group_size",
        "engine.device",
    ]


def test_sweeps_are_expanded_and_every_job_checked():
    assert len(expand_sweeps(["algorithm=grpo,slca_grpo", "seed=1,2,3"])) == 6
    n, found = check_overrides(["algorithm.tool_weight=-1,1", "seed=1,2"])
    assert n == 4 and len(found) == 1 and "2 of 4 jobs" in found[0].what


def test_validate_raises_one_error_listing_everything():
    cfg = compose_run([])
    cfg.algorithm.eps = -1.0
    cfg.reward.tool_weights.name = 2.0
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    text = str(err.value)
    assert "2 problems" in text and "algorithm.eps" in text and "reward.tool_weights" in text


def test_user_config_folder_adds_options(tmp_path: Path):
    (tmp_path / "backbone").mkdir()
    (tmp_path / "backbone" / "mine.yaml").write_text(
        "defaults:\n  - /schema/backbone@_here_\n  - _self_\nname: mine\nsource: local\n"
        "path: /models/mine\n"
    )
    cfg = compose_run(["backbone=mine"], extra_config_dirs=[str(tmp_path)])
    assert cfg.backbone.path == "/models/mine" and cfg.backbone.dtype == "float32"
    (tmp_path / "backbone" / "typo.yaml").write_text("name: x\nsorce: local\n")
    (found,) = problems("backbone=typo", extra_config_dirs=[str(tmp_path)])
    assert found.key == "backbone.sorce"


def test_schema_defaults_equal_the_default_yaml_values_where_documented():
    # The YAML options restate the paper's values; the schema must agree with them.
    cfg = compose_run([])
    schema = OmegaConf.structured(RunConfig)
    for key in ("reward.tool_weights", "algorithm.eps", "reward.no_call_penalty"):
        assert OmegaConf.select(cfg, key) == OmegaConf.select(schema, key)
