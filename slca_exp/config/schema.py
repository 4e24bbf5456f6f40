"""The typed schema of a run: one dataclass per config group, stored in Hydra's ConfigStore.

``conf/config.yaml`` puts :class:`RunConfig` (stored as ``run_config``) first in its defaults
list, so every YAML option of every group is merged onto its dataclass: a wrong type or an unknown
key in a YAML file fails composition with its full key. Value checks (ranges, choices) live next
to each field (``param(..., gt=0)``) and cross-field checks in ``slca_exp/preflight/validate.py``;
both run before anything starts.

Each group schema is also stored as ``schema/<group>`` so a user's own option file can extend it:
``defaults: [/schema/judge@_here_, _self_]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from hydra.core.config_store import ConfigStore

from slca_exp.config.fields import param
from slca_exp.config.services import JudgeConfig, SimulatorConfig

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from slca_exp.core.problems import Problem

DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class TinyArchConfig:
    """Architecture of a tiny causal LM built from scratch (``backbone.source=builtin``)."""

    num_layers: int = param(2, "transformer blocks", gt=0)
    hidden_size: int = param(64, "model width", gt=0)
    num_heads: int = param(4, "attention heads; hidden_size / num_heads must be even", gt=0)
    intermediate_size: int = param(128, "MLP width", gt=0)
    vocab_size: int = param(
        1024, "most tokens of the BPE tokenizer trained on the split (at least 265)", gt=0
    )
    max_position_embeddings: int = param(1024, "longest sequence the model accepts", gt=0)


@dataclass
class BackboneConfig:
    """The policy model (recorded component 1 of 5)."""

    name: str = param("tiny", "identifier recorded with the run")
    source: str = param(
        "builtin",
        "builtin (tiny, built here) | hf (hub id) | local (a folder)",
        choices=("builtin", "hf", "local"),
    )
    path: str | None = param(None, "hub id or local folder of the weights (source hf/local)")
    revision: str | None = param(None, "pinned hub revision (commit) of the weights")
    dtype: str = param("float32", "parameter dtype", choices=DTYPES)
    chat_template: str | None = param(
        None, "jinja chat-template file (hermes / ChatML layout); default: the tokenizer's"
    )
    arch: TinyArchConfig | None = param(None, "architecture when source=builtin")


@dataclass
class ToolWeights:
    """HierR tool process weights: R_tool = sum(weight * component)."""

    format: float = param(0.10, "well-formed <tool_call> blocks", ge=0, finite=True)
    name: float = param(0.25, "tool-name F1 against gold", ge=0, finite=True)
    key: float = param(0.15, "argument-key Jaccard", ge=0, finite=True)
    value: float = param(0.20, "argument-value agreement", ge=0, finite=True)
    parallel: float = param(0.30, "calls per turn match gold", ge=0, finite=True)


@dataclass
class OutcomeJudgeConfig:
    """The outcome judge of ``reward.tool_reward=outcome``, which decides whether a task is solved.

    It asks the summary judge's server (``judge.*``: model, endpoint, service, decoding, cache)
    with prompts of its own, or decides on CPU from the synthetic world's facts.
    """

    backend: str = param(
        "auto",
        "auto (openai when judge.backend asks a server, else facts) | facts (deterministic CPU: "
        "Solved when the rollout's tool answers hold the facts of the gold calls' answers and "
        "its final answer states them) | openai (the judge's server, with the prompts below) | "
        "a plugin's",
    )
    prompt: str | None = param(
        None,
        "first prompt (question and final answer -> Solved | Unsolved | Unsure): a file, or a "
        "template shipped in slca_exp/judges/prompts/outcome/; null: exec_outcome_check_v1.txt",
    )
    fallback_prompt: str | None = param(
        None,
        "asked when the first answer is Unsure, with the tool interactions as well; null: "
        "exec_outcome_fallback_v1.txt",
    )
    prompt_version: str | None = param(None, "prompt version recorded with the run")
    min_answer_chars: int = param(
        10, "a final answer shorter than this is Unsolved without asking (0: off)", ge=0
    )


@dataclass
class RewardConfig:
    """HierR rewards (recorded component 2 of 5)."""

    name: str = param("hierr", "identifier recorded with the run")
    variant: str = param(
        "strict", "paper (exact parity) | strict (defects fixed)", choices=("paper", "strict")
    )
    tool_weights: ToolWeights = param(default_factory=ToolWeights, help="tool process weights")
    normalize: bool = param(False, "rescale tool_weights to sum to 1 (and record the result)")
    logged_weights: ToolWeights | None = param(
        None,
        "the weights of the HierR score logged as the tool process score (reward/tool/hierr, "
        "val/tool_success@k) when it should not be R_tool's own: ablation=no_hierr trains with "
        "every tool weight 0 and logs the score under the paper's weights; null: tool_weights "
        "(as normalized)",
    )
    process_weight: float = param(1.0, "w_process: weight of R_tool in the total", ge=0)
    summary_weight: float = param(1.0, "w_respq: weight of R_sum in the total", ge=0)
    no_call_penalty: float = param(
        -0.5, "total score when a call was needed and none made", le=0, finite=True
    )
    judge_failure: str = param(
        "absent",
        "absent (summary not scored) | zero (paper: score 0) | stop (absent, and the run stops "
        "at a step where every judge or simulator request failed)",
        choices=("absent", "zero", "stop"),
    )
    normalize_strings: bool = param(False, "BFCL-style string normalisation (strict variant)")
    tool_reward: str = param(
        "hierr",
        "what R_tool is: hierr (the tool process score above) | outcome (the outcome judge's "
        "verdict, 1 Solved else 0; HierR's parts are still computed and logged)",
        choices=("hierr", "outcome"),
    )
    outcome: OutcomeJudgeConfig = param(
        default_factory=OutcomeJudgeConfig, help="the outcome judge (tool_reward=outcome)"
    )
    judge_view: str = param(
        "responses",
        "what the summary judge is shown: responses (the numbered tool responses and the final "
        "reply, the main reward) | interaction (every tool call, then every tool response, and "
        "the reply, as the public v8.2 reward showed them; its template needs "
        "{{tool_interactions}}, e.g. judge_prompt=hierr_judge_v82.txt)",
        choices=("responses", "interaction"),
    )
    judge_prompt: str | None = param(
        None,
        "the summary judge's template under this reward, instead of judge.prompt: a file, or "
        "one shipped in slca_exp/judges/prompts/; null: judge.prompt. A judge that renders no "
        "template (rubric) ignores it",
    )
    judge_prompt_version: str | None = param(
        None, "judge_prompt's version, recorded with the run; null: the file's stem"
    )
    no_tool_response: str = param(
        "zero",
        "a rollout without a tool response: zero (0 without asking the judge, the main reward; "
        "judge.short_circuit_no_tool_response=false also turns it off) | judge (judged like any "
        "other, the public v8.2 reward; a no-call the penalty scores is still not judged)",
        choices=("zero", "judge"),
    )


@dataclass
class DataFiles:
    """Parquet files of one data split; relative paths are relative to ``data.dir``."""

    sft: str | None = param(None, "SFT trajectories")
    train: str | None = param(None, "RL prompts")
    val: str | None = param(None, "validation prompts")


@dataclass
class DataConfig:
    """The data split (recorded component 5 of 5)."""

    name: str = param("synthetic", "identifier recorded with the run")
    kind: str = param(
        "synthetic",
        "registered data source: synthetic (generated here) | files (user parquet files) | a "
        "plugin's",
    )
    dir: str | None = param(
        None,
        "folder of the files; synthetic: where they are written "
        "(null: <tracking.root>/data/synthetic/rows=<rows>-seed=<seed>)",
    )
    files: DataFiles = param(default_factory=DataFiles, help="split files (kind files only)")
    rows: int = param(
        256, "synthetic: RL train rows; sft gets as many, val max(16, rows // 4)", gt=0
    )
    seed: int = param(42, "data generation / shuffling seed")
    instructions: str | None = param(
        None, "how to obtain the files (kind files): shown when data.dir or a file is missing"
    )


@dataclass
class AlgorithmConfig:
    """The advantage estimator and its hyper-parameters."""

    name: str = param("slca_grpo", "estimator: grpo | slca_grpo | toolpo_grpo (registry name)")
    group_size: int = param(8, "rollouts per prompt (GRPO's n)", ge=2)
    norm_by_std: bool = param(True, "divide by the group std (False: Dr.GRPO, mean only)")
    eps: float = param(1e-6, "added to the group std", gt=0, finite=True)
    tool_weight: float = param(
        1.0, "lambda_tool, post-normalisation (slca_grpo)", ge=0, finite=True
    )
    summary_weight: float = param(
        1.0, "lambda_sum, post-normalisation (slca_grpo)", ge=0, finite=True
    )
    toolpo_lambda: float = param(
        1.0, "weight of the tool-only advantage (toolpo_grpo)", ge=0, finite=True
    )


@dataclass
class SFTConfig:
    """Supervised warm-start on the gold trajectories of the SFT split (stage 1)."""

    enabled: bool = param(True, "run the SFT stage (reused across runs of the same recipe)")
    steps: int = param(200, "optimizer steps", ge=0)
    batch_size: int = param(16, "trajectories per step", gt=0)
    lr: float = param(3e-3, "AdamW learning rate", gt=0, finite=True)
    max_len: int = param(512, "tokens per trajectory (longer ones are cut)", gt=0)


@dataclass
class RolloutConfig:
    """Multi-turn rollouts: assistant turn, simulated tool responses (mask 0), ..., summary."""

    prompts_per_step: int = param(4, "prompts per RL step (each sampled group_size times)", gt=0)
    max_turns: int = param(3, "assistant turns that may call tools before the last one", ge=0)
    max_turn_tokens: int = param(96, "tokens one assistant turn may generate", ge=16)
    max_response_tokens: int = param(384, "response budget: generated + injected tokens", gt=0)
    temperature: float = param(1.0, "sampling temperature", gt=0, finite=True)


@dataclass
class RLConfig:
    """The RL stage (stage 2): rollouts, HierR rewards, the estimator, a clipped PG update."""

    enabled: bool = param(True, "run the RL stage")
    steps: int = param(20, "RL steps (one batch of rollouts each)", ge=0)
    lr: float = param(1e-4, "AdamW learning rate", gt=0, finite=True)
    epochs: int = param(1, "passes over each batch of rollouts", gt=0)
    minibatches: int = param(
        1, "updates per pass: the step's rollouts in this many shares (sizes differ by <= 1)", gt=0
    )
    clip_ratio: float = param(0.2, "PPO clip range of the importance ratio", gt=0, finite=True)
    clip_ratio_c: float = param(
        3.0, "dual clip: a token with negative advantage loses at most -A * this", gt=1, finite=True
    )
    kl_coef: float = param(0.0, "weight of the low-variance KL to the frozen reference", ge=0)
    grad_clip: float = param(1.0, "max gradient norm", gt=0, finite=True)
    grad_cos: bool = param(
        False,
        "diagnostic, on both engines (verl: in its actor): before each RL step's update, "
        "cos(grad_tool, grad_summary) and both gradient norms on the step's batch "
        "(train/grad_cos, train/grad_norm_tool, train/grad_norm_summary), from two extra "
        "forward-backward passes: the update takes about 3x as long",
    )
    mask_rule: str = param(
        "parity",
        "segment boundary, as engine.verl.mask_rule: parity, the paper's rule (the last learnable "
        "run is the summary, even a tool call cut off by the turn or token budget) | corrected "
        "(a rollout ending on an unanswered or malformed tool call has no summary: all its "
        "learnable tokens are tool)",
        choices=("parity", "corrected"),
    )


@dataclass
class EngineConfig:
    """Where and how the run executes: what every engine reads.

    An engine with settings of its own extends this class with them (``engine.<its name>.*``:
    the verl engine's ``engine.verl``) and registers it as its schema
    (``slca_exp.engines.register_engine``); its option file in ``conf/engine/`` merges onto it
    (``defaults: [/schema/engine_<name>@_here_, _self_]``), so a key it does not declare is
    refused with its full name like any other.
    """

    weights_on_this_host: ClassVar[bool] = False
    """The engine loads the backbone's weights on the host that checks the recipe (a missing
    hub download is then refused before anything starts)."""

    name: str = param(
        "local", "registered engine: local (CPU / one GPU) | verl (cluster) | a plugin's"
    )
    device: str = param("auto", "auto | cpu | cuda", choices=("auto", "cpu", "cuda"))
    sft: SFTConfig = param(default_factory=SFTConfig, help="SFT stage")
    rl: RLConfig = param(default_factory=RLConfig, help="RL stage")
    rollout: RolloutConfig = param(default_factory=RolloutConfig, help="multi-turn rollouts")
    val_every: int = param(10, "validate every N RL steps (0: only before and after RL)", ge=0)
    val_rows: int = param(32, "validation prompts (greedy, one sample each)", gt=0)
    checkpoint_every: int = param(10, "checkpoint every N RL steps (and on SIGTERM)", gt=0)
    progress: bool = param(True, "progress bar with live reward and advantage stats")

    @classmethod
    def problems(cls, cfg: DictConfig) -> list[Problem]:
        """The engine's checks across config groups, on the composed config (``[]``: none).

        Run with every other check of the config (``validate``, ``--dry-run``, composing a
        sweep), before the typed config exists; an engine's schema overrides it.
        """
        return []


@dataclass
class RolloutLogConfig:
    """Which sampled rollouts are logged: traces, tables and the HTML credit view."""

    every: int = param(
        10,
        "log the rollouts of RL step 1 and of every N-th step, and of every validation (0: no "
        "rollouts at all)",
        ge=0,
    )
    per_step: int = param(
        4, "rollouts per logged step: the best and the worst of each of per_step/2 groups", gt=0
    )
    val: int = param(8, "validation rollouts traced per validation (the table holds all)", ge=0)
    html: bool = param(True, "an HTML credit view per logged step (token-level advantages)")


@dataclass
class TrackingConfig:
    """Experiment trackers that receive the recipe and metrics (only global rank 0 logs)."""

    backends: list[str] = param(
        default_factory=list,
        help="registered trackers, any of: mlflow, wandb, console, a plugin's",
    )
    root: str = param(
        "${oc.env:SLCA_EXP_ROOT,outputs}",
        "output root (relative: to the launch folder); holds mlflow.db, mlartifacts/, wandb/",
    )
    mlflow_uri: str | None = param(
        None, "MLflow tracking URI, e.g. http://127.0.0.1:5000; null: sqlite:///<root>/mlflow.db"
    )
    wandb_mode: str = param(
        "offline",
        "offline (files under <root>/wandb; `wandb sync` uploads later) | online | disabled",
        choices=("offline", "online", "disabled"),
    )
    wandb_project: str | None = param(None, "W&B project; null: experiment_name")
    wandb_entity: str | None = param(None, "W&B entity (recorded in the offline run)")
    job_type: str = param("train", "W&B job_type")
    console_every: int = param(10, "console tracker: print a table row every N steps", gt=0)
    retry_every_s: float = param(
        5.0, "while the MLflow server is unreachable, try it again at most this often", gt=0
    )
    flush_timeout_s: float = param(
        60.0, "at finish, keep replaying spooled metrics this long before giving up", ge=0
    )
    http_retries: int = param(
        1, "MLflow HTTP retries per request (MLFLOW_HTTP_REQUEST_MAX_RETRIES wins)", ge=0
    )
    http_timeout_s: int = param(
        10, "MLflow HTTP timeout in seconds (MLFLOW_HTTP_REQUEST_TIMEOUT wins)", gt=0
    )
    allow_sqlite_on_network_fs: bool = param(
        False,
        "let SLURM or multi-node jobs share the sqlite store on a network filesystem (NFS, "
        "Lustre, GPFS, ...), whose file locks SQLite cannot rely on; default: refused (use a "
        "server: tracking.mlflow_uri)",
    )
    plots: bool = param(True, "log end-of-run plots (reward curves, advantage histograms)")
    rollouts: RolloutLogConfig = param(
        default_factory=RolloutLogConfig, help="sampled rollouts: traces, tables, credit views"
    )
    log_model: bool = param(
        True,
        "record the final policy as a logged model with a copy of its files; false: a "
        "reference to where they are (large weights stay put)",
    )


@dataclass
class EvalConfig:
    """The final checkpoint on a benchmark when training ends, in the same job (slca-exp eval)."""

    after_train: bool = param(
        False, "when the run finishes, score its final checkpoint as slca-exp eval does"
    )
    benchmark: str = param("bfcl_v3", "the benchmark option (benchmark/<name>.yaml)")
    serving: str = param(
        "gpu", "how the checkpoint is served, an eval option (eval/<name>.yaml): gpu | cpu"
    )
    overrides: list[str] = param(
        default_factory=list,
        help="benchmark.KEY=V and eval.KEY=V, as slca-exp eval takes them",
    )


@dataclass
class RunConfig:
    """One run: the five recorded components, the algorithm, the engine and tracking."""

    backbone: BackboneConfig = param(default_factory=BackboneConfig, help="policy model")
    reward: RewardConfig = param(default_factory=RewardConfig, help="HierR rewards")
    judge: JudgeConfig = param(default_factory=JudgeConfig, help="summary judge")
    simulator: SimulatorConfig = param(default_factory=SimulatorConfig, help="tool simulator")
    data: DataConfig = param(default_factory=DataConfig, help="data split")
    algorithm: AlgorithmConfig = param(default_factory=AlgorithmConfig, help="estimator")
    engine: EngineConfig = param(default_factory=EngineConfig, help="execution engine")
    tracking: TrackingConfig = param(default_factory=TrackingConfig, help="trackers")
    eval: EvalConfig = param(
        default_factory=EvalConfig, help="the final checkpoint on a benchmark (after_train)"
    )
    experiment_name: str = param("slca-exp", "experiment name (MLflow experiment, W&B project)")
    run_name: str | None = param(None, "run name; default: derived from the overrides")
    seed: int = param(42, "seed for model init and sampling")


GROUPS: dict[str, type] = {
    "backbone": BackboneConfig,
    "reward": RewardConfig,
    "judge": JudgeConfig,
    "simulator": SimulatorConfig,
    "data": DataConfig,
    "algorithm": AlgorithmConfig,
    "engine": EngineConfig,
    "tracking": TrackingConfig,
}
"""Config group -> its schema."""


def register_configs() -> None:
    """Store the schemas in Hydra's ConfigStore (idempotent)."""
    cs = ConfigStore.instance()
    cs.store(name="run_config", node=RunConfig)
    for group, schema in GROUPS.items():
        cs.store(group="schema", name=group, node=schema)


register_configs()
