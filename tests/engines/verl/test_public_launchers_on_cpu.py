"""Every launcher of the public SLCA-GRPO code: a row of docs/public-code.md, its command pinned.

The public code is github.com/SLCA-GRPO/SLCA-GRPO at commit 68539c5. Each of its RL launchers is
the main launcher (``rl/slca_grpo/train_slca_grpo.sh``, whose every value is pinned in
``test_paper_preset_on_cpu.py``: ``RL``) with a few values changed; each row below keeps those
changes, as verl keys of the translated config or as our own section of it (what verl's reward
workers and tools read), with the line of the launcher that sets them. Every other value of the
main table must hold as the main launcher has it. The SFT configs are pinned the same way
against ``sft/qwen2_5_7b_split_sft.yaml`` (``SFT_ROWS``).

The docs table is checked against ``PUBLIC``, the launchers and configs of the public code at
that commit; every command it gives composes and passes ``--dry-run``.
"""

import re
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.paper_splits import toucan_named_folder
from tests.skip_policy import require

require("verl", reason="needs the verl extra")
pytestmark = pytest.mark.verl

from omegaconf import OmegaConf  # noqa: E402

from slca_exp.commands import main  # noqa: E402
from slca_exp.engines.verl.keys import GRAD_COS_KEY, OUR_KEY, ROLLOUT, TURNS  # noqa: E402
from tests.engines.verl.test_paper_preset_on_cpu import RL, SFT_ROWS, same  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "public-code.md"
COMMIT = "68539c5"

PUBLIC = (
    # every launcher and every training or serving config of the public code at COMMIT
    "rl/slca_grpo/train_slca_grpo.sh",
    "rl/slca_grpo/config/toucan_grpo.yaml",
    "rl/slca_grpo/config/tool_config/toucan_tool_config.yaml",
    "rl/judge/serve_llm_judge_gpt_oss.sh",
    "rl/sgls/serve_sgls_qwen3_235b.sh",
    "ablations/train_ablation_wo_slca.sh",
    "ablations/train_ablation_wo_sgls.sh",
    "ablations/train_ablation_wo_tool_reward.sh",
    "ablations/train_ablation_wo_parallel.sh",
    "ablations/config/toucan_tool_config_no_schema.yaml",
    "ablations/tools/toucan_vllm_tool_no_schema.py",
    "analysis/hierr_sweep/reward_fn_hierr_v82.py",
    "analysis/hierr_sweep/train_hierr_default.sh",
    "analysis/hierr_sweep/train_hierr_uniform.sh",
    "analysis/hierr_sweep/train_hierr_name_heavy.sh",
    "analysis/hierr_sweep/train_hierr_value_heavy.sh",
    "analysis/grad_cosine/train_grad_cosine_grpo.sh",
    "analysis/grad_cosine/train_grad_cosine_slca.sh",
    "analysis/execution_reward/train_exec_grpo.sh",
    "analysis/execution_reward/train_exec_slca.sh",
    "analysis/execution_reward/reward_fn_exec_based.py",
    "baselines/toolpo/train_toolpo_qwen2.5-3B.sh",
    "baselines/toolpo/train_toolpo_qwen2.5-7B.sh",
    "baselines/toolpo/train_toolpo_qwen3-8B-Base.sh",
    "baselines/toolpo/reward_fn_toolpo.py",
    "baselines/toolpo/reward_fn_toolpo_sum_action.py",
    "baselines/rltr/train_rltr_2stage_qwen2.5-3B.sh",
    "baselines/rltr/train_rltr_2stage_qwen2.5-7B.sh",
    "baselines/rltr/train_rltr_2stage_qwen3-8B-Base.sh",
    "baselines/rltr/reward_fn_rltr.py",
    "baselines/rltr/prepare_planner_sft_data.py",
    "baselines/rltr/sft_configs/planner_sft_qwen2.5-3B.yaml",
    "baselines/rltr/sft_configs/planner_sft_qwen2.5-7B.yaml",
    "baselines/rltr/sft_configs/planner_sft_qwen3-8B-Base.yaml",
    "baselines/rltr/sft_configs/train_planner_sft_distributed.sh",
    "sft/train_sft.sh",
    "sft/qwen2_5_3b_split_sft.yaml",
    "sft/qwen2_5_7b_split_sft.yaml",
    "sft/qwen3_8b_base_split_sft.yaml",
    "sft/qwen2_5_7b_full_sft.yaml",
    "eval/bfcl_v3/start_vllm_server.sh",
    "eval/bfcl_v3/bfcl_v3_eval.py",
    "eval/bfcl_v3/toucan_xlam_tool_parser_plugin.py",
    "eval/tau2_bench/start_tau2_agent_vllm_server.sh",
    "eval/tau2_bench/start_tau2_user_vllm_server.sh",
    "eval/tau2_bench/tau2_bench_eval.py",
)

R = f"{OUR_KEY}.reward."
J = f"{OUR_KEY}.judge."
S = f"{OUR_KEY}.simulator."
WEIGHTS = ("format", "name", "key", "value", "parallel")


def weights(where, *values):
    """The five SLCA_WEIGHT_* process weights a launcher exports, as our reward section."""
    return [(R + f"tool_weights.{k}", v, where) for k, v in zip(WEIGHTS, values, strict=True)]


def lengths(where, prompt, model_len):
    """MAX_PROMPT_LENGTH and MAX_MODEL_LEN, as the verl keys they set."""
    return [
        ("data.max_prompt_length", prompt, f"{where}: MAX_PROMPT_LENGTH={prompt}"),
        (ROLLOUT + "prompt_length", prompt, f"{where}: MAX_PROMPT_LENGTH={prompt}"),
        (ROLLOUT + "max_model_len", model_len, f"{where}: MAX_MODEL_LEN={model_len}"),
    ]


def estimator(where, name):
    return [("algorithm.adv_estimator", name, f"{where}: algorithm.adv_estimator={name}")]


def v82(where):
    """REWARD_FN_PATH=reward_fn_hierr_v82.py: the v8.2 reward, its judge view and prompt."""
    return [
        (R + "name", "hierr_v82", f"{where}: REWARD_FN_PATH=.../reward_fn_hierr_v82.py"),
        (R + "variant", "paper", f"{where}: reward_fn_hierr_v82.py's process score"),
        (R + "judge_view", "interaction", f"{where}: v8.2's judge sees calls and responses"),
        (R + "judge_failure", "zero", f"{where}: JUDGE_FAILURE_SCORE=0.0"),
    ]


MAIN_OURS = [
    # what the main launcher sets that is not a verl key: our section of the translated config
    (R + "name", "hierr_paper", "train_slca_grpo.sh: REWARD_FN_PATH=rl/slca_grpo/reward_fn.py"),
    (R + "variant", "paper", "train_slca_grpo.sh: reward_fn.py's process score"),
    (R + "judge_view", "responses", "reward_fn.py: the judge sees the tool responses only"),
    *weights("train_slca_grpo.sh: SLCA_WEIGHT_*", 0.10, 0.25, 0.15, 0.20, 0.30),
    (R + "process_weight", 1.0, "train_slca_grpo.sh: SLCA_WEIGHT_PROCESS=1.0"),
    (R + "summary_weight", 1.0, "train_slca_grpo.sh: SLCA_WEIGHT_RESPQ=1.0"),
    (R + "no_call_penalty", -0.5, "train_slca_grpo.sh: NO_CALL_PENALTY=-0.5"),
    (R + "judge_failure", "zero", "train_slca_grpo.sh: JUDGE_FAILURE_SCORE=0.0"),
    (R + "tool_reward", "hierr", "train_slca_grpo.sh: HierR's process score is R_tool"),
    (J + "model", "openai/gpt-oss-120b", "train_slca_grpo.sh: LLM_JUDGE_MODEL=gpt-oss-120b"),
    (J + "timeout_s", 540.0, "train_slca_grpo.sh: LLM_JUDGE_TIMEOUT=540"),
    (J + "max_retries", 3, "train_slca_grpo.sh: LLM_JUDGE_MAX_RETRIES=3"),
    (S + "backend", "sgls", "toucan_tool_config.yaml: class_name ToucanVLLMTool (SGLS)"),
    (S + "model", "Qwen/Qwen3-235B-A22B-Instruct-2507", "toucan_tool_config.yaml: qwen3-235b-a22b"),
    (S + "temperature", 0.6, "toucan_tool_config.yaml: temperature: 0.6"),
    (S + "max_tokens", 4096, "toucan_tool_config.yaml: max_new_tokens: 4096"),
    (S + "timeout_s", 540.0, "toucan_tool_config.yaml: timeout: 540"),
    (S + "schema_guidance", True, "toucan_vllm_tool.py: the tool's definition in the prompt"),
    (GRAD_COS_KEY, False, "train_slca_grpo.sh: no compute_grad_cosine"),
    ("data.seed", 43, "train_slca_grpo.sh: data.seed unset (unseeded); ours: data=toucan's 43"),
    ("data.val_max_samples", -1, "toucan_grpo.yaml: val_max_samples: 0 (every row, as -1)"),
]


@dataclass
class Launcher:
    """A public RL launcher: the command that mirrors it and how it differs from the main one."""

    overrides: list[str]
    changed: list[tuple[str, object, str]] = field(default_factory=list)
    """(key of the translated RL config, the launcher's value, where the launcher sets it)."""


ABL = "ablations/train_ablation_wo_{}.sh"
ABLATION = [*lengths("ablations/train_ablation_wo_*.sh", 16384, 24576)]
HIERR = "analysis/hierr_sweep/train_hierr_{}.sh"
GRAD = "analysis/grad_cosine/train_grad_cosine_{}.sh"
EXEC = "analysis/execution_reward/train_exec_{}.sh"
PAPER = ["experiment=paper_7b"]
TOOLPO = "baselines/toolpo/train_toolpo_{}.sh"
TOOLPO_LENGTHS = [
    # the ToolPO launchers' own lengths and checkpoint count, on the command line
    "engine.verl.max_prompt_length=16384",
    "engine.verl.max_model_len=24576",
    "engine.verl.keep_checkpoints=9",
]

LAUNCHERS = {
    "rl/slca_grpo/train_slca_grpo.sh": Launcher(PAPER),
    ABL.format("slca"): Launcher(
        [*PAPER, "ablation=no_slca"],
        [*estimator(ABL.format("slca"), "grpo"), *ABLATION, *v82(ABL.format("slca"))],
    ),
    ABL.format("sgls"): Launcher(
        [*PAPER, "ablation=no_sgls"],
        [
            *ABLATION,
            *v82(ABL.format("sgls")),
            (S + "schema_guidance", False, "toucan_tool_config_no_schema.yaml: NoSchema class"),
            (S + "prompt", "sgls_no_schema_v1.txt", "toucan_vllm_tool_no_schema.py: no definition"),
            (S + "model", "Qwen/Qwen3-235B-A22B-Instruct-2507", "the same simulator model"),
            (S + "temperature", 0.6, "toucan_tool_config_no_schema.yaml: temperature: 0.6"),
        ],
    ),
    ABL.format("tool_reward"): Launcher(
        [*PAPER, "ablation=no_hierr"],
        [
            *ABLATION,
            *v82(ABL.format("tool_reward")),
            *weights(ABL.format("tool_reward") + ": SLCA_WEIGHT_*=0.0", 0.0, 0.0, 0.0, 0.0, 0.0),
            (R + "summary_weight", 1.0, ABL.format("tool_reward") + ": SLCA_WEIGHT_RESPQ=1.0"),
        ],
    ),
    ABL.format("parallel"): Launcher(
        [*PAPER, "ablation=no_parallel"],
        [
            *ABLATION,
            *v82(ABL.format("parallel")),
            *weights(ABL.format("parallel") + ": SLCA_WEIGHT_*", 0.15, 0.30, 0.25, 0.30, 0.0),
            (R + "normalize", False, ABL.format("parallel") + ": the weights as exported"),
        ],
    ),
    **{
        HIERR.format(name): Launcher(
            [*PAPER, "reward=hierr_v82", "data.seed=43", f"hierr_weights={name}"],
            [
                *v82(HIERR.format(name)),
                ("data.seed", 43, HIERR.format(name) + ": data.seed=43"),
                *weights(HIERR.format(name) + ": SLCA_WEIGHT_*", *values),
            ],
        )
        for name, values in (
            ("default", (0.10, 0.25, 0.15, 0.20, 0.30)),
            ("uniform", (0.20, 0.20, 0.20, 0.20, 0.20)),
            ("name_heavy", (0.05, 0.40, 0.15, 0.15, 0.25)),
            ("value_heavy", (0.05, 0.20, 0.20, 0.35, 0.20)),
        )
    },
    **{
        GRAD.format(arm): Launcher(
            [
                *PAPER,
                "backbone=qwen2.5-3b-instruct",
                "reward=hierr_v82",
                "data.seed=44",
                "engine.rl.grad_cos=true",
                *extra,
            ],
            [
                *estimator(GRAD.format(arm), name),
                *v82(GRAD.format(arm)),
                ("data.seed", 44, GRAD.format(arm) + ": data.seed=44"),
                (GRAD_COS_KEY, True, GRAD.format(arm) + ": compute_grad_cosine=true"),
                ("backbone", "Qwen/Qwen2.5-3B-Instruct", GRAD.format(arm) + ": the 3B SFT start"),
            ],
        )
        for arm, name, extra in (("grpo", "grpo", ["algorithm=grpo"]), ("slca", "slca_grpo", []))
    },
    **{
        EXEC.format(arm): Launcher(
            [*PAPER, "reward=exec_outcome", *extra],
            [
                *estimator(EXEC.format(arm), name),
                (R + "name", "exec_outcome", EXEC.format(arm) + ": reward_fn_exec_based.py"),
                (R + "tool_reward", "outcome", EXEC.format(arm) + ": R_tool the outcome verdict"),
                # ours, stated in the docs row: a failed judgment is absent, not the launcher's
                # JUDGE_FAILURE_SCORE=0.0
                (R + "judge_failure", "absent", "docs/public-code.md: what differs"),
            ],
        )
        for arm, name, extra in (("grpo", "grpo", ["algorithm=grpo"]), ("slca", "slca_grpo", []))
    },
    **{
        TOOLPO.format(size): Launcher(
            [*PAPER, "algorithm=toolpo_grpo", *TOOLPO_LENGTHS, *extra],
            [
                *estimator(TOOLPO.format(size), "toolpo_grpo"),
                *lengths(TOOLPO.format(size), 16384, 24576),
                ("trainer.max_actor_ckpt_to_keep", 9, TOOLPO.format(size) + ": =9"),
                ("algorithm.slca.toolpo_lambda", 1.0, TOOLPO.format(size) + ": TOOLPO_LAMBDA=1.0"),
                ("backbone", model, TOOLPO.format(size) + ": MODEL_PATH, its split-SFT start"),
            ],
        )
        for size, model, extra in (
            ("qwen2.5-3B", "Qwen/Qwen2.5-3B-Instruct", ["backbone=qwen2.5-3b-instruct"]),
            ("qwen2.5-7B", "Qwen/Qwen2.5-7B-Instruct", []),
            ("qwen3-8B-Base", "Qwen/Qwen3-8B-Base", ["backbone=qwen3-8b-base"]),
        )
    },
}
"""Public RL launcher -> its command and its values that are not the main launcher's."""

SFT_FILES = {
    "sft/qwen2_5_7b_split_sft.yaml": ([], "Qwen/Qwen2.5-7B-Instruct", 2),
    "sft/qwen2_5_3b_split_sft.yaml": (
        ["backbone=qwen2.5-3b-instruct"],
        "Qwen/Qwen2.5-3B-Instruct",
        2,
    ),
    "sft/qwen3_8b_base_split_sft.yaml": (["backbone=qwen3-8b-base"], "Qwen/Qwen3-8B-Base", 2),
    "sft/qwen2_5_7b_full_sft.yaml": (
        ["data.files.sft=sft_full_74k.parquet", "engine.verl.sft_epochs=1"],
        "Qwen/Qwen2.5-7B-Instruct",
        1,
    ),
}
"""SFT config -> its command's overrides (besides the SFT stage alone), model, epochs."""
SFT_ONLY = [*PAPER, "engine.rl.enabled=false"]


@pytest.fixture(scope="module")
def toucan(tmp_path_factory):
    """The paper's file names, the full SFT pool among them (a copy of the SFT split)."""
    folder = toucan_named_folder(tmp_path_factory, 64)
    shutil.copy(folder / "sft_split_42k.parquet", folder / "sft_full_74k.parquet")
    return folder


def dry_run(overrides, toucan, out, capsys):
    """``slca-exp train OVERRIDES --dry-run`` on the paper's cluster profile; the configs it wrote.

    Returns verl's RL config (``None`` if none was written) and SFT config, as checked by verl's
    own validation and written for the job.
    """
    given = [*overrides, f"data.dir={toucan}", "launcher=slurm_gpu_4node"]
    assert main(["train", *given, "launcher.partition=null", "--dry-run", "--offline"]) == 0
    printed = capsys.readouterr().out
    (sft,) = out.rglob("sft_trainer.yaml")
    rl = sorted(out.rglob("ppo_trainer.yaml"))
    assert "verl SFT config checked and written to" in printed
    assert ("verl config checked and written to" in printed) == bool(rl)
    return (OmegaConf.load(rl[0]) if rl else None), OmegaConf.load(sft)


@pytest.mark.usefixtures("here")
@pytest.mark.parametrize("path", sorted(LAUNCHERS), ids=lambda p: p.rsplit("/", 1)[-1])
def test_each_rl_launcher_is_its_command_value_by_value(path, toucan, tmp_path, capsys):
    """The docs' command passes the dry run, and what it writes for verl is the launcher's."""
    launcher = LAUNCHERS[path]
    assert sorted(docs_command(path)) == sorted(launcher.overrides)
    rl, sft = dry_run(launcher.overrides, toucan, tmp_path, capsys)
    expected = {verl_key: (value, where) for _, _, verl_key, value, where in RL}
    expected.update({key: (value, where) for key, value, where in MAIN_OURS})
    expected.update({key: (value, where) for key, value, where in launcher.changed})
    for key, (value, where) in expected.items():
        found = sft.model.path if key == "backbone" else OmegaConf.select(rl, key)
        assert same(found, value), (path, key, found, where)
    for key in ("disable_tool_schema_injection", "wildcard_tool_name"):
        assert OmegaConf.select(rl, TURNS + key) is None, key  # verl 0.9.1 has neither


@pytest.mark.usefixtures("here")
@pytest.mark.parametrize("path", sorted(SFT_FILES), ids=lambda p: p.rsplit("/", 1)[-1])
def test_each_sft_config_is_its_command_value_by_value(path, toucan, tmp_path, capsys):
    extra, model, epochs = SFT_FILES[path]
    assert sorted(docs_command(path)) == sorted([*SFT_ONLY, *extra])
    _, sft = dry_run([*SFT_ONLY, *extra], toucan, tmp_path, capsys)
    assert sft.model.path == model, path
    for _, _, key, value, where in SFT_ROWS:
        if key == "trainer.total_epochs":
            value, where = epochs, f"{path}: num_train_epochs: {epochs}.0"
        assert same(OmegaConf.select(sft, key, throw_on_missing=True), value), (path, where)


# --- the docs table ----------------------------------------------------------------------------


def table():
    """docs/public-code.md's rows: (public files, the slca-exp command or None, the row's text)."""
    rows = []
    for line in PAGE.read_text().splitlines():
        if not line.startswith("| `") or line.startswith("| `sweep="):
            continue
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        first = re.findall(r"`([^`]+)`", cells[0])
        folder = first[0].rsplit("/", 1)[0]
        files = [f if "/" in f else f"{folder}/{f}" for f in first]
        command = re.match(r"`(slca-exp [^`]+)`", cells[2])
        rows.append((files, command.group(1) if command else None, cells))
    return rows


def test_every_public_launcher_and_config_is_a_row_of_the_docs_table():
    listed = [f for files, _, _ in table() for f in files]
    assert sorted(listed) == sorted(PUBLIC)  # each once, and nothing the public code lacks


def train_overrides(command):
    words = shlex.split(command)
    assert words[:2] == ["slca-exp", "train"], command
    return words[2:]


def docs_command(path):
    """The overrides of the ``slca-exp train`` command the docs table gives for ``path``."""
    (command,) = [c for files, c, _ in table() if files == [path]]
    return train_overrides(command)


def test_each_docs_command_is_the_pinned_one():
    pinned = {path: launcher.overrides for path, launcher in LAUNCHERS.items()}
    pinned |= {path: [*SFT_ONLY, *extra] for path, (extra, _, _) in SFT_FILES.items()}
    commands = {}
    for files, command, _ in table():
        if command is None or not command.startswith("slca-exp train"):
            continue
        (path,) = files
        commands[path] = sorted(train_overrides(command))
    assert commands == {path: sorted(o) for path, o in pinned.items()}


def test_the_rows_without_a_command_say_why():
    for files, command, cells in table():
        if command is None:
            assert cells[3] and cells[3] != "none", files
