"""``engine=verl`` stage 1: the config, data and checkpoint of verl's own SFT trainer, on CPU."""

import json

import pytest

from tests.skip_policy import require

require("verl", reason="needs the verl extra")
pytestmark = pytest.mark.verl

from omegaconf import OmegaConf  # noqa: E402

from slca_exp.backbones.chat import GENERATION_PROMPT, render_text  # noqa: E402
from slca_exp.backbones.tiny import train_tokenizer  # noqa: E402
from slca_exp.data.rows import gold_messages, sft_row  # noqa: E402
from slca_exp.data.splits import DataError  # noqa: E402
from slca_exp.data.synthetic import build_rows  # noqa: E402
from slca_exp.engines.verl import sft, sft_data  # noqa: E402
from slca_exp.engines.verl.checks import check_sft_config  # noqa: E402
from slca_exp.engines.verl.keys import SFT_CONFIG_FILE  # noqa: E402
from slca_exp.engines.verl.sft import finished_sft, sft_command  # noqa: E402
from slca_exp.engines.verl.sft_config import sft_checkpoint, sft_config  # noqa: E402
from slca_exp.engines.verl.sft_data import write_sft_data  # noqa: E402
from slca_exp.preflight.compose import compose_run  # noqa: E402
from slca_exp.preflight.validate import ConfigError, validate  # noqa: E402


def run_config(*overrides, experiment=None):
    """The typed config of ``engine=verl`` (or an experiment) + ``overrides``."""
    head = [f"experiment={experiment}"] if experiment else ["engine=verl"]
    config = validate(compose_run([*head, *overrides]))
    assert config.engine.name == "verl"
    return config


def hub(*overrides):
    """The default ``engine=verl`` recipe with a hub backbone."""
    return run_config("backbone=qwen2.5-7b-instruct", *overrides)


def keys(problems):
    return [p.key for p in problems]


def tools_of(row):
    return json.loads(row["reward_model"]["ground_truth"]["tool_schemas"])


@pytest.fixture(scope="module")
def rows():
    return [sft_row(r) for r in build_rows(8, "sft", seed=5)]


@pytest.fixture(scope="module")
def tokenizer(rows):
    texts = [render_text(gold_messages(r), tools_of(r)) for r in rows]
    return train_tokenizer(texts, vocab_size=500, max_length=4096)


def test_the_default_verl_recipe_translates_to_an_sft_config_verl_accepts():
    config = hub("run_name=seed-1")
    cfg = sft_config(config)
    assert check_sft_config(cfg) == []
    assert cfg.model.path == "Qwen/Qwen2.5-7B-Instruct"
    s = config.engine.sft
    assert (cfg.data.max_length, cfg.data.train_batch_size) == (s.max_len, s.batch_size)
    assert cfg.optim.lr == s.lr and cfg.trainer.total_training_steps == s.steps
    assert cfg.trainer.total_epochs >= 1
    assert (cfg.data.messages_key, cfg.data.tools_key) == ("messages", "tools")
    assert cfg.data.train_files.endswith("/verl/sft_data/sft.parquet")
    assert cfg.data.custom_cls.path == "pkg://slca_exp.engines.verl.sft_data"
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node) == (1, 8)
    assert cfg.engine.strategy == config.engine.verl.strategy
    assert cfg.trainer.default_local_dir.endswith("/verl/sft")
    assert cfg.trainer.experiment_name == "seed-1-sft"
    assert list(cfg.trainer.logger) == list(config.tracking.backends)
    assert cfg.trainer.seed == cfg.engine.seed == config.seed
    assert "hf_model" in cfg.checkpoint.save_contents
    # verl's own defaults are kept where we set nothing
    assert cfg.data.pad_mode == "no_padding" and cfg.optim.lr_scheduler_type == "constant"


def test_paper_7b_translates_to_an_sft_config_verl_accepts():
    # 32 GPUs: the SFT batch must split over them (the default 16 does not; see the next test)
    cfg = sft_config(run_config("engine.sft.batch_size=64", experiment="paper_7b"))
    assert check_sft_config(cfg) == []
    assert cfg.model.path == "Qwen/Qwen2.5-7B-Instruct"
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node) == (4, 8)
    assert cfg.trainer.project_name == "paper-7b"


@pytest.mark.parametrize(
    ("overrides", "sft_overrides", "key", "ours"),
    [
        (["engine.sft.batch_size=12"], [], "data.train_batch_size", "engine.sft.batch_size"),
        (
            ["engine.sft.batch_size=16", "engine.verl.nnodes=4", "engine.verl.n_gpus_per_node=8"],
            [],
            "data.train_batch_size",
            "engine.verl.nnodes",
        ),
        (["engine.sft.steps=0"], [], "trainer.total_training_steps", "engine.sft.steps"),
        (["engine.sft.max_len=10000"], [], "data.max_token_len_per_gpu", "sft_overrides"),
        (
            [],
            ["engine.ulysses_sequence_parallel_size=3"],
            "engine.ulysses_sequence_parallel_size",
            "sft_overrides",
        ),
        ([], ["trainer.profile_interval=[3,1]"], "trainer.profile_interval", "sft_overrides"),
        ([], ["engine.strategy=deepspeed"], "engine.strategy", "engine.verl.strategy"),
        ([], ["trainer.logger=[console,tb]"], "trainer.logger[1]", "tracking.backends"),
        ([], ["optim.lr_scheduler_type=linear"], "optim", "sft_overrides"),
    ],
)
def test_verl_refuses_bad_values_naming_the_verl_key_and_ours(overrides, sft_overrides, key, ours):
    config = hub(*overrides)
    config.engine.verl.sft_overrides = sft_overrides
    problems = check_sft_config(sft_config(config))
    assert key in keys(problems)
    assert ours in next(p for p in problems if p.key == key).fix


def test_sft_overrides_are_applied_last_with_hydra_semantics():
    config = hub()
    config.engine.verl.sft_overrides = ["optim.weight_decay=0.0", "data.max_length=1024"]
    cfg = sft_config(config)
    assert cfg.optim.weight_decay == 0.0 and cfg.data.max_length == 1024
    assert check_sft_config(cfg) == []


def test_bad_sft_overrides_are_all_reported_with_their_index():
    config = hub()
    config.engine.verl.sft_overrides = ["optim.lrr=1e-5", "model=hf_model", "nonsense"]
    with pytest.raises(ConfigError) as err:
        sft_config(config)
    assert keys(err.value.problems) == [f"engine.verl.sft_overrides[{i}]" for i in range(3)]
    assert "did you mean optim.lr" in err.value.problems[0].fix


def test_verls_dataset_loads_the_converted_split_and_learns_assistant_tokens_only(
    rows, tokenizer, tmp_path
):
    from verl.trainer.sft_trainer_ray import create_sft_dataset

    path = write_sft_data(rows, tmp_path / "sft.parquet")
    cfg = sft_config(hub("engine.sft.max_len=4096"))
    # the trainer's own lookup: data.custom_cls -> our subclass of verl's MultiTurnSFTDataset
    dataset = create_sft_dataset(str(path), cfg.data, tokenizer, processor=None)
    assert len(dataset) == len(rows)
    parallel = next(
        i for i, r in enumerate(rows) if any(len(s) > 1 for s in json.loads(gold_steps(r)))
    )
    for i in (0, parallel):
        item = dataset[i]
        ids, mask = item["input_ids"].tolist(), item["loss_mask"].tolist()
        assert len(ids) == len(mask)
        messages = gold_messages(rows[i])
        assistant = [
            render_text([m])[len(GENERATION_PROMPT) :] for m in messages if m["role"] == "assistant"
        ]
        learned = tokenizer.decode(
            [t for t, m in zip(ids, mask, strict=True) if m], skip_special_tokens=False
        )
        assert learned == "".join(assistant)
        text = tokenizer.decode(ids, skip_special_tokens=False)
        assert "null" not in text  # each call's own arguments, each tool's own parameters
        for m in messages:
            for call in m.get("tool_calls") or []:
                args = json.dumps(call["function"]["arguments"], separators=(",", ":"))
                assert f'"arguments":{args}' in text
        first = render_text(messages[:1], tools_of(rows[i]))
        assert text.startswith(first) and mask[: len(tokenizer(first)["input_ids"])] == [0] * len(
            tokenizer(first)["input_ids"]
        )


def gold_steps(row):
    return row["reward_model"]["ground_truth"]["gold_tool_calls"]


def test_rows_that_cannot_be_trained_on_are_reported_by_index(rows, tmp_path):
    broken = [
        rows[0],
        {**rows[1], "messages": "[]"},
        {k: v for k, v in rows[2].items() if k != "messages"},
    ]
    with pytest.raises(DataError) as err:
        write_sft_data(broken, tmp_path / "sft.parquet")
    (problem,) = err.value.problems
    assert problem.key == "data.files.sft" and "row 1" in problem.what and "row 2" in problem.what
    assert not (tmp_path / "sft.parquet").exists()


def test_openai_wire_arguments_become_objects():
    chat = sft_data.chat_messages(
        [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}
                ],
            },
        ]
    )
    assert chat[1]["content"] == "" and chat[1]["tool_calls"][0]["function"]["arguments"] == {
        "a": 1
    }


def test_sft_checkpoint_is_where_verl_saves_the_hf_weights(tmp_path):
    """verl's own CheckpointHandler picks the folder; its FSDP manager adds ``huggingface``."""
    import inspect

    from verl.utils.checkpoint import CheckpointHandler, OrchestrationMode
    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
    from verl.utils.config import omega_conf_to_dataclass

    cfg = sft_config(hub("engine.sft.steps=7"))
    cfg.trainer.default_local_dir = str(tmp_path / "sft")
    saved = []

    class Engine:  # what the Ray trainer hands the handler: its worker group
        def save_checkpoint(self, local_path, **_):
            saved.append(local_path)

    class Loader:
        def state_dict(self):
            return {}

    handler = CheckpointHandler(
        engine=Engine(),
        train_dataloader=Loader(),
        default_local_dir=cfg.trainer.default_local_dir,
        mode=OrchestrationMode.RAY,
    )
    handler.save_checkpoint(step=cfg.trainer.total_training_steps)  # the trainer's last save
    (step_dir,) = saved
    assert sft_checkpoint(cfg).parent == tmp_path / "sft" / "global_step_7" == tmp_path / step_dir
    assert find_latest_ckpt_path(cfg.trainer.default_local_dir) == step_dir
    assert sft_checkpoint(cfg).name == "huggingface"
    source = inspect.getsource(FSDPCheckpointManager.save_checkpoint)
    assert 'hf_local_path = os.path.join(local_path, "huggingface")' in source
    assert "hf_model" in omega_conf_to_dataclass(cfg.checkpoint).save_contents


def test_the_written_config_is_what_verls_hydra_entry_point_composes(tmp_path):
    import importlib

    from hydra import compose, initialize_config_dir

    from slca_exp.engines.verl.side_files import write_verl_config

    cfg = sft_config(hub())
    path = write_verl_config(cfg, tmp_path / "verl" / SFT_CONFIG_FILE)
    command = sft_command(path)
    assert command[1:3] == ["-m", "verl.trainer.sft_trainer_ray"]
    assert callable(importlib.import_module(command[2]).main)
    options = dict(arg.lstrip("-").split("=", 1) for arg in command[3:])
    with initialize_config_dir(options["config-path"], version_base=None):
        composed = compose(config_name=options["config-name"])
    assert OmegaConf.to_container(composed) == OmegaConf.to_container(cfg)
    assert options["hydra.run.dir"].startswith(str(tmp_path / "verl"))


def test_parallel_calls_are_why_the_per_turn_mismatch_is_tolerated(rows, tokenizer, tmp_path):
    """ChatML joins consecutive tool responses into one turn; verl renders turn by turn."""
    from verl.trainer.sft_trainer_ray import create_sft_dataset

    cfg = sft_config(hub("engine.sft.max_len=4096"))
    assert cfg.data.ignore_input_ids_mismatch is True
    cfg.data.ignore_input_ids_mismatch = False  # verl's default
    dataset = create_sft_dataset(
        str(write_sft_data(rows, tmp_path / "sft.parquet")), cfg.data, tokenizer, processor=None
    )
    parallel = [any(len(s) > 1 for s in json.loads(gold_steps(r))) for r in rows]
    for i, has_parallel in enumerate(parallel):
        if has_parallel:
            with pytest.raises(AssertionError, match="ignore_input_ids_mismatch"):
                dataset[i]
        else:
            dataset[i]
    assert any(parallel)


def test_run_sft_launches_verls_trainer_on_the_written_config_and_data(monkeypatch):
    import subprocess

    config = hub("engine.sft.steps=3", "engine.sft.batch_size=8")
    cfg = sft_config(config)
    launched = []

    def trainer(command, env, check):  # stands in for verl's trainer on GPUs
        written = OmegaConf.load(command[3].split("=", 1)[1] + "/" + SFT_CONFIG_FILE)
        assert OmegaConf.to_container(written) == OmegaConf.to_container(cfg)
        assert check_sft_config(written) == []  # the converted split holds a batch
        assert "VERL_USE_EXTERNAL_MODULES" in env
        launched.append(command)
        sft_checkpoint(written).mkdir(parents=True)
        (sft_checkpoint(written) / "model.safetensors").write_bytes(b"")
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(sft.subprocess, "run", trainer)
    assert sft.run_sft(config) == sft_checkpoint(cfg)
    assert sft.run_sft(config) == sft_checkpoint(cfg) and len(launched) == 1  # reused
    config.engine.sft.enabled = False
    assert sft.run_sft(config) is None


def test_a_finished_sft_stage_is_found_and_not_repeated():
    import shutil

    config = hub("seed=123")  # a run folder of its own
    weights = sft_checkpoint(sft_config(config))
    assert finished_sft(config) is None  # nothing saved yet
    try:
        weights.mkdir(parents=True)
        (weights / "config.json").write_text("{}")  # verl writes these before the weights
        assert finished_sft(config) is None
        (weights / "model.safetensors").write_bytes(b"")
        assert finished_sft(config) == weights
        config.engine.sft.enabled = False
        assert finished_sft(config) is None
    finally:
        shutil.rmtree(weights.parents[1], ignore_errors=True)
