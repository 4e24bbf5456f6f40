"""GPU check: the local engine on one GPU, and our estimators against verl's GRPO on GPU tensors.

Three parts, each printing a table (run it on a machine with a CUDA device; ``--device cpu``
runs the same code paths on CPU, smaller):

1. Estimators on the device, side by side in this process, on verl-shaped batches (0-4 tool
   turns with injected responses, then a summary; B x T x group): our ``slca_grpo`` and
   ``grpo``, verl's ``compute_grpo_outcome_advantage`` and its vectorised variant, and our
   ``slca_grpo`` through verl's own ``compute_advantage`` (the plugin's registered estimator, on
   rewards laid out as our reward side writes them: R_tool on the last tool token, R_sum on the
   last summary token). Our ``grpo`` must equal verl's on the device before anything is timed.
   Median milliseconds per call (CUDA synchronised), the ratio to verl's GRPO, and for each size
   the ratio of ``slca_grpo`` through verl to verl's vectorised GRPO (the target: at most 2x).
   On CPU the (B, T) outputs cost page faults or not depending on what glibc does with freed
   memory, which varies from run to run; ``--allocator both`` (the default there) times the
   table as the process finds the allocator, then again in a child process with glibc's mmap
   and trim thresholds pinned high (freed memory is reused: the kernels alone, the steady state
   of a long training process).
2. The local engine (``slca-exp train``, its CLI) with a random-init backbone larger than the
   tiny default on ``engine.device``: the per-phase time of an RL step read back from the run's
   MLflow metrics (``perf/time/*``, ``perf/step_s``), and the estimator's share of the step.

3. ``verl-smoke``: ``experiment=verl_smoke`` through verl (SFT through verl's SFT trainer, then
   SLCA-GRPO through its PPO trainer with slca-exp's trainer, reward manager, agent loop and
   tools) with the cuda backend (vLLM rollout) on one GPU: the step time by verl phase, the
   generated and trained tokens/s. What CI runs on CPU (``engine.verl.backend=cpu``) is the same
   command with ``--device cpu``.

    python benchmarks/gpu_check.py [--device cuda] [--sizes 1024x4096x16,4096x4096x16]
        [--hidden 1024 --layers 8 --steps 6] [--skip-engine] [--allocator both|default|pinned]
    python benchmarks/gpu_check.py verl-smoke [--device cuda] [--verl-steps 6]
        [--verl-sft-steps 20] [--verl-batch 2]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.estimators import make_batch  # noqa: E402
from slca_exp.estimators import grpo_advantages, slca_grpo_advantages  # noqa: E402
from slca_exp.estimators.segments import split_segments  # noqa: E402

PHASES = ("generate", "simulate", "reward", "advantage", "update")


def timed(fn: Callable[[], object], device: torch.device, rounds: int) -> float:
    """Median seconds per call of ``fn`` (after one warm-up), synchronising the device."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    sync()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def estimators(
    device: torch.device, sizes: list[tuple[int, int, int]], rounds: int, allocator: str
) -> None:
    import slca_exp.engines.verl.plugin  # noqa: F401 - registers slca_grpo in verl

    where = f", allocator {allocator}" if allocator else ""
    print(f"estimators on {device} (median ms per call, {rounds} rounds{where})")
    print(f"{'B x T x group':<18} {'competitor':<22} {'ms':>9} {'vs verl grpo':>13}")
    ratios = []
    for batch, length, group in sizes:
        results = one_size(device, batch, length, group, rounds)
        base = results["verl grpo"]
        size = f"{batch}x{length}x{group}"
        for name, seconds in results.items():
            print(f"{size:<18} {name:<22} {seconds * 1e3:>9.2f} {seconds / base:>12.2f}x")
        ratio = results[THROUGH_VERL] / results[VERL_VECTORISED]
        ratios.append(f"{size}: {ratio:.2f}x")
    print(
        f"{THROUGH_VERL} / {VERL_VECTORISED} (target <= 2x): " + ", ".join(ratios),
        flush=True,
    )


THROUGH_VERL = "slca_grpo via verl"
VERL_VECTORISED = "verl grpo (vectorised)"


def one_size(device: torch.device, batch: int, length: int, group: int, rounds: int) -> dict:
    """Competitor -> median seconds on one verl-shaped batch (after the GRPO parity check)."""
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.ray_trainer import compute_advantage

    d = make_batch(batch, length, group)
    mask, rewards = d["mask"].to(device), d["rewards"].to(device)
    tool, summary, total = (d[k].to(device) for k in ("tool", "summary", "total"))
    segment_rewards = placed(d["mask"], d["tool"], d["summary"]).to(device)
    index = d["index"]
    ours = grpo_advantages(mask, index, total, eps=1e-6).advantages
    verl_adv, _ = core_algos.compute_grpo_outcome_advantage(rewards, mask, index, epsilon=1e-6)
    torch.testing.assert_close(ours, verl_adv.float(), atol=1e-5, rtol=0)
    algo = OmegaConf.create({"adv_estimator": "slca_grpo", "norm_adv_by_std_in_grpo": True})

    def through_verl() -> object:
        tensors = {"token_level_rewards": segment_rewards, "response_mask": mask}
        data = DataProto.from_dict(tensors=tensors)
        data.non_tensor_batch["uid"] = index
        return compute_advantage(data, adv_estimator="slca_grpo", config=algo)

    fns = {
        "verl grpo": lambda: core_algos.compute_grpo_outcome_advantage(rewards, mask, index),
        VERL_VECTORISED: lambda: core_algos.compute_grpo_vectorized_outcome_advantage(
            rewards, mask, index
        ),
        "ours grpo": lambda: grpo_advantages(mask, index, total),
        "ours slca_grpo": lambda: slca_grpo_advantages(mask, index, tool, summary),
        THROUGH_VERL: through_verl,
    }
    return {name: timed(fn, device, rounds) for name, fn in fns.items()}


def placed(mask: torch.Tensor, tool: torch.Tensor, summary: torch.Tensor) -> torch.Tensor:
    """(B, T) rewards as our reward side writes them: R_tool and R_sum at their segments' ends."""
    split = split_segments(mask)
    rewards = torch.zeros(mask.shape)
    rows = torch.arange(mask.shape[0])
    last = split.summary_start + split.summary_len - 1
    rewards[rows[split.has_summary], last[split.has_summary]] = summary[split.has_summary]
    tool_mask = split.tool_mask
    last_tool = mask.shape[1] - 1 - tool_mask.flip(1).to(torch.uint8).argmax(dim=1)
    rewards[rows[split.has_tool], last_tool[split.has_tool]] = tool[split.has_tool]
    return rewards


def train_run(args: list[str], tmp: str) -> tuple[object, object, float, object]:
    """Run ``slca-exp train`` in ``tmp``; its MLflow client, its run (not an SFT child run),
    the wall seconds and the finished process."""
    from mlflow.tracking import MlflowClient

    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    start = time.perf_counter()
    res = subprocess.run(args, cwd=tmp, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if res.returncode != 0:
        raise SystemExit(f"slca-exp train failed ({res.returncode}):\n{res.stderr[-4000:]}")
    client = MlflowClient(f"sqlite:///{tmp}/mlflow.db")
    (run,) = [
        r
        for e in client.search_experiments()
        for r in client.search_runs([e.experiment_id])
        if r.data.tags.get("slca.stage") != "sft"
    ]
    return client, run, wall, res


def engine(device: str, hidden: int, layers: int, steps: int, group: int) -> None:

    heads = max(1, hidden // 64)
    with tempfile.TemporaryDirectory(prefix="slca-gpu-check-") as tmp:
        args = [
            str(Path(sys.executable).parent / "slca-exp"),
            "train",
            f"engine.device={device}",
            f"backbone.arch.hidden_size={hidden}",
            f"backbone.arch.num_layers={layers}",
            f"backbone.arch.num_heads={heads}",
            f"backbone.arch.intermediate_size={4 * hidden}",
            "engine.sft.steps=20",
            f"engine.rl.steps={steps}",
            f"algorithm.group_size={group}",
            "engine.val_rows=4",
            "engine.val_every=0",
            "engine.progress=false",
            f"tracking.root={tmp}",
        ]
        client, run, wall, _ = train_run(args, tmp)

        def mean(name: str) -> float:
            values = [m.value for m in client.get_metric_history(run.info.run_id, name)]
            return statistics.mean(values[1:] or values)  # the first step warms up

        step = mean("perf/step_s")
        params = f"{hidden} hidden x {layers} layers"
        print(f"\nlocal engine on {device}: random-init Qwen2 backbone ({params}), "
              f"group {group}, {steps} RL steps, whole run {wall:.0f} s")  # fmt: skip
        print(f"{'phase':<10} {'ms/step':>9} {'share':>7}")
        for phase in PHASES:
            ms = mean(f"perf/time/{phase}") * 1e3
            print(f"{phase:<10} {ms:>9.1f} {ms / 10 / step:>6.1f}%")
        print(f"{'step':<10} {step * 1e3:>9.1f}")
        print(f"response tokens/s: {mean('perf/tokens_per_s'):,.0f}")


def verl_smoke(backend: str, steps: int, sft_steps: int, batch: int, group: int) -> None:
    """``experiment=verl_smoke`` through verl on ``backend``: step time and tokens/s by phase.

    On a GPU (``cuda``: vLLM rollout, FSDP on one GPU) this is the smoke the CPU backend runs in
    CI; ``--device cpu`` runs the same command on the ``cpu`` backend.
    """

    with tempfile.TemporaryDirectory(prefix="slca-verl-smoke-") as tmp:
        args = [
            str(Path(sys.executable).parent / "slca-exp"),
            "train",
            "experiment=verl_smoke",
            f"engine.verl.backend={backend}",
            "engine.verl.n_gpus_per_node=1",
            f"engine.verl.total_training_steps={steps}",
            f"engine.verl.train_batch_size={batch}",
            f"engine.verl.ppo_mini_batch_size={batch}",
            f"algorithm.group_size={group}",
            f"engine.sft.steps={max(1, sft_steps)}",
            f"engine.sft.enabled={str(sft_steps > 0).lower()}",
            f"tracking.root={tmp}",
        ]
        if backend == "cuda":  # one GPU shared by the trainer and vLLM
            args += ["engine.verl.gpu_memory_utilization=0.4"]
        print("$ " + " ".join(args[1:]), flush=True)
        client, run, wall, res = train_run(args, tmp)

        def series(name: str) -> list[float]:
            return [m.value for m in client.get_metric_history(run.info.run_id, name)]

        def steady(name: str) -> float:
            values = series(name)
            return statistics.median(values[1:] or values) if values else math.nan

        closing = [line for line in res.stdout.splitlines() if "verl run took" in line]
        print(f"\nverl_smoke on the {backend} backend: group {group}, {batch} prompts/step, "
              f"{steps} RL steps, SFT {sft_steps} steps; whole command {wall:.0f} s")  # fmt: skip
        if closing:
            print(closing[-1])
        print(f"{'phase':<16} {'s/step':>8}   (median over steps 2..{steps}; step 1 apart)")
        for phase in ("gen", "old_log_prob", "ref", "adv", "update_actor", "update_weights"):
            print(f"{phase:<16} {steady(f'timing_s/{phase}'):>8.3f}")
        first = series("timing_s/step")
        print(f"{'step':<16} {steady('timing_s/step'):>8.3f}   step 1: {first[0]:.3f}")
        generated = steady("response_length/mean") * batch * group
        print(f"generated tokens/s (rollout, tool responses included): "
              f"{generated / steady('timing_s/gen'):,.0f}")  # fmt: skip
        print(f"trained tokens/s (verl's perf/throughput): {steady('perf/throughput'):,.0f}")


PINNED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(2**30), "MALLOC_TRIM_THRESHOLD_": str(2**31)}
"""glibc's thresholds pinned high: freed (B, T) outputs are reused, not handed back."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "command",
        nargs="?",
        choices=("all", "verl-smoke"),
        default="all",
        help="all: estimators then the local engine; verl-smoke: experiment=verl_smoke through "
        "verl on --device (cuda: vLLM rollout on one GPU)",
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--sizes", default="1024x4096x16,4096x4096x16", help="BxTxgroup,...")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--skip-engine", action="store_true")
    parser.add_argument(
        "--allocator",
        choices=("both", "default", "pinned"),
        default="both",
        help="CPU only: default: as found; pinned: glibc thresholds pinned (a child process)",
    )
    parser.add_argument("--verl-steps", type=int, default=6, help="verl-smoke: RL steps")
    parser.add_argument("--verl-sft-steps", type=int, default=20, help="verl-smoke: SFT steps")
    parser.add_argument("--verl-batch", type=int, default=2, help="verl-smoke: prompts per step")
    args = parser.parse_args()
    if args.command == "verl-smoke":
        backend = "cuda" if args.device.startswith("cuda") else "cpu"
        verl_smoke(backend, args.verl_steps, args.verl_sft_steps, args.verl_batch, 4)
        return 0
    device = torch.device(args.device)
    if device.type == "cuda":
        print(f"device: {torch.cuda.get_device_name(device)}")
    sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
    if device.type != "cpu":
        estimators(device, sizes, args.rounds, "")
    elif all(os.environ.get(k) == v for k, v in PINNED_MALLOC.items()):
        estimators(device, sizes, args.rounds, "pinned")
    else:
        if args.allocator != "pinned":
            estimators(device, sizes, args.rounds, "as found")
        if args.allocator != "default":
            # glibc reads these at process start: time the pinned table in a child process.
            cmd = [sys.executable, __file__, "--device", "cpu", "--sizes", args.sizes]
            cmd += ["--rounds", str(args.rounds), "--allocator", "pinned", "--skip-engine"]
            print(flush=True)
            subprocess.run(cmd, env={**os.environ, **PINNED_MALLOC}, check=True)
    if not args.skip_engine:
        engine(args.device, args.hidden, args.layers, args.steps, args.group)
    return 0


if __name__ == "__main__":
    sys.exit(main())
