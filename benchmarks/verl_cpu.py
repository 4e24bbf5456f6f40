"""verl on CPU, with each of its rollouts, against the local engine: an RL step by phase.

One recipe, ``experiment=verl_smoke``'s sizes (tiny backbone, synthetic split, ``slca_grpo``,
group 4, 2 prompts per step, at most 3 assistant turns and 256 response tokens, temperature
0.8, a KL loss of 0.001, one update per step), run as a user runs it (``slca-exp train``, one
process each): through verl with verl's vLLM rollout on vLLM's CPU build
(``engine.verl.cpu_rollout=vllm``), through verl with the transformers rollout (``hf``), and
through the local engine (``--rollouts`` picks verl's). All start from the same checkpoint,
the tiny backbone fine-tuned here on the gold trajectories (the local engine's SFT,
``--sft-steps`` x ``--sft-batch``), so the policy writes tool calls and some rollouts are
multi-turn; every run has its own SFT stage off. Each run's per-step phase times are read
back from its MLflow run:

    phase          engine=verl (backend=cpu)           engine=local
    generation     timing_s/gen: the agent loops,      perf/time/generate + simulate + reward
                   tool calls and scoring included
      tool calls   agent loops' tool_calls, summed     perf/time/simulate
      reward       agent loops' compute_score, summed  perf/time/reward
    old log-prob   timing_s/old_log_prob               - (the sampler's log-probs are used)
    ref log-prob   timing_s/ref                        - (inside the update)
    advantage      timing_s/adv                        perf/time/advantage
    update         timing_s/update_actor               perf/time/update
    weight sync    timing_s/update_weights             - (one model in one process)
    step           timing_s/step                       perf/step_s

verl scores each rollout in its agent loop as soon as the rollout finishes (a reward loop
worker runs ``SLCARewardManager``), while other rollouts are still generating, so verl records
no reward phase (its ``timing_s/reward`` times a reward model that shares the trainer's
resources). Each rollout's own timings (``generate_sequences``, ``tool_calls``,
``compute_score``) stay in the TransferQueue, where verl's trainer does not log them. The verl
run therefore samples through ``PolledReplayBuffer`` (``benchmarks/verl_sampler.py``), verl's
synchronous replay buffer given through verl's own extension point
(``trainer.v1.sampler.custom_sampler``): it logs those per-rollout timings summed over the
step's rollouts, and polls the TransferQueue every ``--verl-poll`` seconds. verl's own poll is
2 s, which rounds ``timing_s/gen`` up to a multiple of 2 s and hides the generation time of a
step this small.

Medians are over the steps after the first; step 1 (warm-up: verl starts its agent-loop workers
and data-loader processes there) is shown apart. Start-up: from the command to the MLflow run,
from the run to the start of step 1, and from the last step to the end of the command.

Threads: both engines run with one intra-op thread by default (``--threads``; verl's rollout
server has one anyway). On a host busier than its cores, a tiny model's multi-threaded ops wait
on each other and slow down by an order of magnitude, by how much depending on the moment's
load: with each engine's own default (``--threads 0``: verl's trainer workers one thread per
core, the local engine torch's default) the two runs, minutes apart, are not comparable on a
shared host. The host's load is printed for each run.

    python benchmarks/verl_cpu.py [--steps 5] [--sft-steps 80 --sft-batch 8 --sft-lr 5e-3]
        [--verl-poll 0.1] [--val-rows 4] [--threads 1] [--rollouts vllm,hf] [--root DIR]
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slca_exp.core import names  # noqa: E402

ENV_VARS = "ray_kwargs.ray_init.runtime_env.env_vars"
"""verl's key of its workers' environment variables."""
CLOSING = "slca-exp: verl run took"
"""The verl engine's closing line (its wall time with the SFT, RL and set-up shares)."""
SAMPLER = Path(__file__).with_name("verl_sampler.py")
"""The replay buffer verl's trainer loads for the verl run (``PolledReplayBuffer``)."""
AGENT_LOOP_TIMINGS = ("generate_sequences", "tool_calls", "compute_score")
"""Per-rollout seconds verl's agent loops record (``AgentLoopMetrics``)."""
AGENT_LOOP_KEY = "bench/agent_loop/{}/sum"
"""Their sum over a step's rollouts, as the sampler logs them (verl adds up ``sum`` metrics)."""


def build_policy(root: Path, sft: Any) -> tuple[Path, Any, float]:  # noqa: ANN401
    """The checkpoint both engines start from: verl_smoke's tiny backbone after a short SFT.

    The local engine's SFT (``train_sft``) on the split's gold trajectories, with ``sft``'s
    steps, batch size and learning rate; a folder left by an earlier run with the same settings
    under ``root`` is reused.

    Returns:
        ``(checkpoint folder, the composed verl_smoke config, seconds it took)``.

    """
    import torch
    from transformers.utils import logging as hf_logging

    from slca_exp.engines.local import data_io
    from slca_exp.engines.local.sft import save_weights, train_sft
    from slca_exp.preflight.compose import compose_run
    from slca_exp.preflight.validate import validate

    hf_logging.disable_progress_bar()
    start = time.perf_counter()
    torch.set_num_threads(1)  # a tiny model: more threads only contend on a shared host
    cfg = validate(compose_run(["experiment=verl_smoke", f"tracking.root={root}"]))
    folder = root / f"policy-sft{sft.steps}x{sft.batch_size}-lr{sft.lr:g}"
    if (folder / "config.json").is_file():
        return folder, cfg, time.perf_counter() - start
    splits = data_io.load(cfg)
    backbone = data_io.backbone(cfg, splits, torch.device("cpu"))
    model, tok = backbone.model, backbone.tokenizer
    settings = type(cfg.engine.sft)(
        steps=sft.steps, batch_size=sft.batch_size, lr=sft.lr, max_len=cfg.engine.sft.max_len
    )
    examples = data_io.sft_examples(tok, splits["sft"].rows, settings.max_len)
    train_sft(model, examples, settings, seed=cfg.seed, pad_id=tok.pad_token_id)
    save_weights(model, tok, folder)
    return folder, cfg, time.perf_counter() - start


def common_overrides(root: Path, policy: Path, name: str) -> list[str]:
    """What every run shares: the checkpoint, no SFT stage, the store, no end-of-run plots."""
    return [
        "backbone.source=local",
        "backbone.name=tiny-sft",
        f"backbone.path={policy}",
        "engine.sft.enabled=false",
        f"tracking.root={root}",
        f"experiment_name={name}",
        "tracking.plots=false",
    ]


def thread_env(threads: int) -> dict[str, str]:
    """The variables that set torch's intra-op threads in a new process."""
    return {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def verl_overrides(steps: int, poll: float, threads: int, raw: Sequence[str] = ()) -> list[str]:
    """``experiment=verl_smoke`` for ``steps`` RL steps, sampling through :data:`SAMPLER`.

    ``threads`` > 0 pins the intra-op threads of verl's processes (its rollout server keeps
    one); ``raw``: more verl overrides.
    """
    raw = [
        *raw,
        "trainer.val_before_train=false",
        f"trainer.v1.sampler.custom_sampler.path={SAMPLER}",
        "trainer.v1.sampler.custom_sampler.name=PolledReplayBuffer",
        f"+trainer.v1.sampler.sampler_kwargs.poll_interval={poll}",
    ]
    if threads > 0:  # Ray takes environment values as strings only
        raw += [f"{ENV_VARS}.{name}=str({value})" for name, value in thread_env(threads).items()]
    return [
        "experiment=verl_smoke",
        f"engine.verl.total_training_steps={steps}",
        "engine.verl.overrides=[" + ",".join(f'"{r}"' for r in raw) + "]",
    ]


def local_overrides(cfg: Any, steps: int, val_rows: int) -> list[str]:  # noqa: ANN401
    """The local engine's settings that match verl_smoke's verl ones (``cfg``), key by key."""
    v = cfg.engine.verl
    return [
        "engine=local",
        f"data.rows={cfg.data.rows}",
        f"algorithm.group_size={cfg.algorithm.group_size}",
        f"engine.rl.steps={steps}",
        f"engine.rollout.prompts_per_step={v.train_batch_size}",
        # verl counts every assistant turn, the local engine the turns before the last one
        f"engine.rollout.max_turns={v.max_assistant_turns - 1}",
        # verl's rollout gives one turn what is left of the response budget
        f"engine.rollout.max_turn_tokens={v.max_response_length}",
        f"engine.rollout.max_response_tokens={v.max_response_length}",
        f"engine.rollout.temperature={v.temperature}",
        f"engine.rl.lr={v.lr}",
        f"engine.rl.kl_coef={v.kl_loss_coef if v.use_kl_loss else 0.0}",
        f"engine.rl.minibatches={max(1, v.train_batch_size // v.ppo_mini_batch_size)}",
        f"engine.val_rows={val_rows}",
        "engine.val_every=0",
        "engine.progress=false",
    ]


def train(args: list[str], root: Path, label: str, env_extra: Mapping[str, str]) -> float:
    """Run ``slca-exp train`` with ``args`` (output to ``<root>/<label>.log``).

    Returns:
        When the command was started (``time.time()``).

    """
    exe = str(Path(sys.executable).parent / "slca-exp")
    # self-contained: a local Ray and the store under root, whatever this shell points at
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS")}
    env.update(env_extra)
    log = root / f"{label}.log"
    start = time.time()
    with log.open("w") as out:
        res = subprocess.run([exe, "train", *args], cwd=root, env=env, stdout=out, stderr=out)
    if res.returncode != 0:
        tail = log.read_text()[-4000:]
        raise SystemExit(f"{label}: slca-exp train failed ({res.returncode}):\n{tail}")
    return start


class RunTimes:
    """One MLflow run's per-step metrics (name -> [value by step]) and timestamps."""

    def __init__(
        self, uri: str, experiment: str, launched: float, ended: float, load: tuple[float, float]
    ) -> None:
        """Read the run of ``experiment`` that this command opened, from the store ``uri``.

        Args:
            uri: the MLflow store.
            experiment: the run's MLflow experiment.
            launched: when its command started (``time.time()``).
            ended: when its command ended.
            load: the host's 1-minute load average when it started and when it ended.

        """
        from mlflow.tracking import MlflowClient

        client = MlflowClient(uri)
        found = client.get_experiment_by_name(experiment)
        if found is None:
            raise SystemExit(f"no MLflow experiment {experiment!r} in {uri}")
        runs = [  # a kept --root holds the runs of earlier commands too
            r
            for r in client.search_runs([found.experiment_id])
            if r.data.tags.get("slca.stage") != "sft" and r.info.start_time >= launched * 1e3
        ]
        if len(runs) != 1:
            raise SystemExit(f"expected one new run in {experiment!r}, found {len(runs)}")
        self.run = runs[0]
        self.client = client
        self.launched, self.ended, self.load = launched, ended, load
        self._cache: dict[str, list[tuple[int, float, float]]] = {}

    def history(self, name: str) -> list[tuple[int, float, float]]:
        """``(step, value, logged at in s)`` of metric ``name``, by step; [] if never logged."""
        if name not in self._cache:
            got = self.client.get_metric_history(self.run.info.run_id, name)
            self._cache[name] = sorted((m.step, m.value, m.timestamp / 1e3) for m in got)
        return self._cache[name]

    def values(self, names: Sequence[str]) -> list[float] | None:
        """Per step, the sum of ``names``; None if one of them was never logged."""
        columns = [self.history(n) for n in names]
        if not all(columns):
            return None
        return [sum(col[i][1] for col in columns) for i in range(min(map(len, columns)))]

    def startup(self, step_metric: str) -> tuple[float, float, float, float]:
        """(command to run, run to step 1, last step to exit, whole command), seconds."""
        steps = self.history(step_metric)
        first_start = steps[0][2] - steps[0][1]
        opened = self.run.info.start_time / 1e3
        return (
            opened - self.launched,
            first_start - opened,
            self.ended - steps[-1][2],
            self.ended - self.launched,
        )


LOCAL_GENERATION = [names.perf_time(p) for p in ("generate", "simulate", "reward")]
"""The local engine's phases that verl's ``timing_s/gen`` covers (rollouts, tools, scoring)."""
VERL_STEP = "timing_s/step"
"""verl's wall time of a whole step."""
VERL_PASSES = ["timing_s/old_log_prob", "timing_s/ref", "timing_s/update_actor"]
"""verl's forward and backward passes over the batch (the local update does all of them)."""
PHASES: list[tuple[str, list[str] | None, list[str] | None]] = [
    ("generation", ["timing_s/gen"], LOCAL_GENERATION),
    ("  tool calls", [AGENT_LOOP_KEY.format("tool_calls")], [names.perf_time("simulate")]),
    ("  reward", [AGENT_LOOP_KEY.format("compute_score")], [names.perf_time("reward")]),
    ("old log-prob", ["timing_s/old_log_prob"], None),
    ("ref log-prob", ["timing_s/ref"], None),
    ("advantage", ["timing_s/adv"], [names.perf_time("advantage")]),
    ("update", ["timing_s/update_actor"], [names.perf_time("update")]),
    ("weight sync", ["timing_s/update_weights"], None),
    ("step", [VERL_STEP], [names.PERF_STEP_S]),
    ("all passes", VERL_PASSES, [names.perf_time("update")]),
]
"""Rows of the table: label, verl's metrics and the local engine's (summed; None: no such
phase in that engine)."""


def first_and_median(values: list[float] | None) -> tuple[float, float] | None:
    """(first step, median of the later ones; the first when there is only one)."""
    if not values:
        return None
    return values[0], statistics.median(values[1:] or values)


def cell(pair: tuple[float, float] | None) -> str:
    """``first median`` in milliseconds, or ``-``."""
    return "-" if pair is None else f"{pair[0] * 1e3:9.1f} {pair[1] * 1e3:9.1f}"


def ratio(a: tuple[float, float] | None, b: tuple[float, float] | None) -> str:
    """verl / local of the medians."""
    if a is None or b is None or b[1] <= 0:
        return "-"
    return f"{a[1] / b[1]:.2f}x"


def tokens_per_step(run: RunTimes, engine: str, rollouts: int) -> float:
    """Median response tokens (generated + tool responses) per step of a run."""
    if engine == "verl":
        return statistics.median(
            [x * rollouts for x in run.values(["response_length/mean"]) or [0.0]]
        )
    rate, step = run.values([names.PERF_TOKENS_PER_S]), run.values([names.PERF_STEP_S])
    return statistics.median([r * s for r, s in zip(rate or [0.0], step or [0.0], strict=False)])


def report(arms: Sequence[tuple[str, str, RunTimes]], steps: int, rollouts: int) -> None:
    """Print the phase table (each arm's step 1 and median, and its ratio to the last arm's
    median: the local engine's) and the start-up of each arm.

    Args:
        arms: ``(label, engine, run)``, the local engine's last.
        steps: RL steps of each run.
        rollouts: rollouts per step.

    """
    later = f"steps 2-{steps}" if steps > 2 else "step 2"
    base_label = arms[-1][0]
    print(f"\nRL step by phase, ms: step 1, then the median of {later}; x: the median over "
          f"{base_label}'s")  # fmt: skip
    head = "".join(f" {label + ' step 1':>14} {'median':>9}" for label, _, _ in arms)
    print(f"{'phase':<13}{head} " + " ".join(f"{'x ' + label:>10}" for label, _, _ in arms[:-1]))
    for label, verl_names, local_names in PHASES:
        pairs = []
        for _, engine, run in arms:
            metrics = verl_names if engine == "verl" else local_names
            pairs.append(first_and_median(run.values(metrics)) if metrics else None)
        cells = "".join(f" {cell(pair):>24}" for pair in pairs)
        ratios = " ".join(f"{ratio(pair, pairs[-1]):>10}" for pair in pairs[:-1])
        print(f"{label:<13}{cells} {ratios}")
    tokens = "".join(f" {tokens_per_step(run, engine, rollouts):>24.0f}" for _, engine, run in arms)
    print(f"{'tokens/step':<13}{tokens}  (median; generated + tool responses)")
    print(
        "generation: the rollouts with their tool calls and scoring (verl: timing_s/gen, the "
        "vllm rollout batching the\n  group's requests, the hf one answering one request at a "
        "time; local: one batched, KV-cached generate\n  per turn). tool calls and reward: "
        "verl's are each rollout's own time summed over the step's rollouts (they\n  overlap "
        "other rollouts' generation). weight sync: the trainer's weights into the rollout "
        "server after the\n  update. all passes: verl's old log-prob, ref log-prob and actor "
        "update against the local update (reference\n  forward and policy update; the old "
        "log-probs are the sampler's)."
    )
    print(f"\n{'start-up and shut-down, s':<30}" + "".join(f" {label:>10}" for label, _, _ in arms))
    rows = ("command -> MLflow run open", "run open -> step 1 starts", "last step -> exit",
            "whole command")  # fmt: skip
    columns = [
        run.startup(VERL_STEP if engine == "verl" else names.PERF_STEP_S) for _, engine, run in arms
    ]
    for i, label in enumerate(rows):
        print(f"{label:<30}" + "".join(f" {column[i]:10.1f}" for column in columns))
    loads = ", ".join(f"{label} {run.load[0]:.1f} -> {run.load[1]:.1f}" for label, _, run in arms)
    print(f"host load (1-minute average), start -> end of each run: {loads}")
    print(
        "command -> run: compose, validate (verl: also its own config checks), recipe, data. "
        "run -> step 1: verl starts\n  Ray, its trainer, reference, rollout (vllm: vLLM's "
        "engine), agent-loop and reward workers and loads the\n  models; local loads the data "
        "and backbone and validates greedily before RL. last step -> exit: verl\n  stops its "
        "workers and Ray; local validates after RL and checkpoints."
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Build the shared checkpoint, run every arm, print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5, help="RL steps of each run")
    parser.add_argument("--sft-steps", type=int, default=80, help="SFT of the shared checkpoint")
    parser.add_argument("--sft-batch", type=int, default=8, help="its trajectories per step")
    parser.add_argument("--sft-lr", type=float, default=5e-3, help="its learning rate")
    parser.add_argument(
        "--verl-poll", type=float, default=0.1, help="seconds between verl's replay-buffer polls"
    )
    parser.add_argument("--val-rows", type=int, default=4, help="local engine: validation prompts")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="intra-op threads of both engines (verl's rollout server has 1 anyway); 0: each "
        "engine's default (verl: one per core; local: torch's)",
    )
    parser.add_argument(
        "--rollouts",
        type=lambda text: [r for r in text.split(",") if r],
        default=["vllm", "hf"],
        help="the cpu backend's rollouts to run verl with, in order (engine.verl.cpu_rollout)",
    )
    parser.add_argument("--root", type=Path, help="keep everything here (default: a temp folder)")
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be at least 2: step 1 is reported apart")
    print("$ python " + shlex.join([os.path.relpath(__file__), *(argv or sys.argv[1:])]))
    cores = len(os.sched_getaffinity(0))
    local_env = thread_env(args.threads) if args.threads > 0 else {}
    with tempfile.TemporaryDirectory(prefix="slca-verl-cpu-") as tmp:
        root = (args.root or Path(tmp)).resolve()
        root.mkdir(parents=True, exist_ok=True)
        sft = argparse.Namespace(steps=args.sft_steps, batch_size=args.sft_batch, lr=args.sft_lr)
        policy, cfg, took = build_policy(root, sft)
        v, group = cfg.engine.verl, cfg.algorithm.group_size
        rollouts = v.train_batch_size * group
        print(
            f"recipe: experiment=verl_smoke's sizes: tiny backbone after {sft.steps} SFT steps "
            f"x {sft.batch_size} (lr {sft.lr:g}; {took:.0f} s, shared by every run),\n"
            f"  synthetic split ({cfg.data.rows} rows), {cfg.algorithm.name}, "
            f"{v.train_batch_size} prompts x group {group} = {rollouts} rollouts per step, "
            f"<= {v.max_assistant_turns} assistant turns,\n  <= {v.max_response_length} "
            f"response tokens, temperature {v.temperature}, KL loss {v.kl_loss_coef}, "
            f"{args.steps} RL steps"
        )
        print(
            f"threads ({cores} cores): verl's trainer workers {args.threads or cores}, its "
            f"rollout server 1; local {args.threads or 'torch default'}. verl's replay buffer "
            f"polls every {args.verl_poll} s"
        )
        arms = []
        plans = [
            (
                f"verl {rollout}",
                "verl",
                [
                    *verl_overrides(args.steps, args.verl_poll, args.threads),
                    f"engine.verl.cpu_rollout={rollout}",
                ],
                {},
            )
            for rollout in args.rollouts
        ]
        plans.append(("local", "local", local_overrides(cfg, args.steps, args.val_rows), local_env))
        for label, engine, extra, env in plans:
            name = label.replace(" ", "-")
            overrides = [*extra, *common_overrides(root, policy, f"bench-{name}")]
            print(f"{label}: slca-exp train " + shlex.join(overrides), flush=True)
            load = os.getloadavg()[0]
            launched = train(overrides, root, name, env)
            run = RunTimes(
                f"sqlite:///{root / 'mlflow.db'}",
                f"bench-{name}",
                launched,
                time.time(),
                (load, os.getloadavg()[0]),
            )
            arms.append((label, engine, run))
        report(arms, args.steps, rollouts)
        for label, _engine, _ in arms[:-1]:
            log = root / f"{label.replace(' ', '-')}.log"
            closing = [ln for ln in log.read_text().splitlines() if CLOSING in ln]
            if closing:
                print(f"{label}'s own account: {closing[-1].strip()}")
        if args.root:
            print(f"runs, logs and the MLflow store: {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
