"""Estimator speed, side by side in one process, one CPU thread.

Competitors on the same verl-shaped batch (int64 response mask with multi-turn structure, uid
strings as group ids, the score on the last response token):

  slca_grpo   slca_exp.estimators.slca_grpo_advantages
  grpo        slca_exp.estimators.grpo_advantages
  verl_grpo   verl's compute_grpo_outcome_advantage (loop over samples)
  verl_vec    verl's compute_grpo_vectorized_outcome_advantage
  reference   the tests' per-sample reference loop of SLCA-GRPO (tests/estimators/reference.py)

Rounds are interleaved (every competitor once per round), so slow drift of the machine hits all
competitors alike; the median and the minimum of each are reported.

At these sizes a call's cost also depends on whether glibc hands back fresh pages for the (B, T)
outputs (page-faulting them in) or reuses freed ones, which varies from run to run. So the
benchmark runs twice: once with the allocator as the process finds it, once more in a child
process with glibc's mmap and trim thresholds pinned high, where freed memory is reused and the
figures measure the kernels alone (the steady state of a long training process). Usage:

    python benchmarks/estimators.py [--sizes 256x2048x8,1024x4096x16,4096x4096x16] [--rounds 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.estimators.reference

from slca_exp.estimators import grpo_advantages, slca_grpo_advantages  # noqa: E402
from tests.estimators.reference import reference_slca  # noqa: E402

try:
    from verl.trainer.ppo import core_algos
except ImportError:  # the verl extra is not installed: compare our own functions only
    core_algos = None

DEFAULT_SIZES = "256x2048x8,1024x4096x16,4096x4096x16"
PINNED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(2**30), "MALLOC_TRIM_THRESHOLD_": str(2**31)}


def make_batch(batch: int, length: int, group: int, seed: int = 0) -> dict[str, object]:
    """A batch shaped like verl's: 0-4 tool turns with injected responses, then a summary."""
    rng = np.random.default_rng(seed)
    mask = np.zeros((batch, length), dtype=np.int64)
    scale = length / 4096
    for b in range(batch):
        pos = 0
        for _ in range(rng.integers(0, 5)):
            n = int(rng.integers(30, 300) * scale) + 1
            mask[b, pos : pos + n] = 1
            pos += n + int(rng.integers(50, 400) * scale) + 1
        n = int(rng.integers(50, 800) * scale) + 1
        mask[b, pos : min(pos + n, length)] = 1
    response_mask = torch.from_numpy(mask)
    tool, summary = torch.rand(batch), torch.rand(batch)
    total = tool + summary
    last = (response_mask * torch.arange(length)).argmax(dim=1)
    rewards = torch.zeros(batch, length)
    rewards[torch.arange(batch), last] = total
    uids = [f"{rng.integers(2**62):016x}" for _ in range(batch // group + 1)]
    index = np.array([uids[i // group] for i in range(batch)], dtype=object)
    return {
        "mask": response_mask,
        "index": index,
        "tool": tool,
        "summary": summary,
        "total": total,
        "rewards": rewards,
    }


def competitors(d: dict[str, object]) -> dict[str, Callable[[], object]]:
    """Name -> zero-argument callable computing advantages of batch ``d``."""
    out: dict[str, Callable[[], object]] = {
        "slca_grpo": lambda: slca_grpo_advantages(d["mask"], d["index"], d["tool"], d["summary"]),
        "grpo": lambda: grpo_advantages(d["mask"], d["index"], d["total"]),
    }
    if core_algos is not None:
        out["verl_grpo"] = lambda: core_algos.compute_grpo_outcome_advantage(
            d["rewards"], d["mask"], d["index"]
        )
        out["verl_vec"] = lambda: core_algos.compute_grpo_vectorized_outcome_advantage(
            d["rewards"], d["mask"], d["index"]
        )
    out["reference"] = lambda: reference_slca(d["mask"], d["index"], d["tool"], d["summary"])
    return out


def measure(
    fns: dict[str, Callable[[], object]], rounds: int, budget_s: float
) -> dict[str, tuple[float, float]]:
    """(median, minimum) seconds per call; slow competitors get fewer rounds (at least 3)."""
    first = {}
    for name, fn in fns.items():  # warm-up, and a first estimate of each cost
        start = time.perf_counter()
        fn()
        first[name] = time.perf_counter() - start
    reps = {n: max(3, min(rounds, int(budget_s / max(t, 1e-9)))) for n, t in first.items()}
    times: dict[str, list[float]] = {n: [] for n in fns}
    for r in range(max(reps.values())):
        for name, fn in fns.items():
            if r < reps[name]:
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    return {n: (statistics.median(t), min(t)) for n, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes", default=DEFAULT_SIZES, help="BxTxG,... (rollouts x tokens x group)"
    )
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds per size")
    parser.add_argument("--budget", type=float, default=3.0, help="seconds per slow competitor")
    parser.add_argument(
        "--allocator",
        choices=("both", "default", "pinned"),
        default="both",
        help="default: as found; pinned: glibc thresholds pinned (child process); both",
    )
    args = parser.parse_args()
    if args.allocator != "pinned":
        run(args, "as found")
        if args.allocator == "default":
            return
        print(flush=True)
    if any(os.environ.get(k) != v for k, v in PINNED_MALLOC.items()):
        # glibc reads these at process start: time the pinned table in a child process.
        cmd = [
            sys.executable,
            __file__,
            "--sizes",
            args.sizes,
            "--rounds",
            str(args.rounds),
            "--budget",
            str(args.budget),
            "--allocator",
            "pinned",
        ]
        env = {**os.environ, **PINNED_MALLOC}
        sys.exit(subprocess.run(cmd, env=env, check=False).returncode)
    run(args, "pinned (glibc mmap/trim thresholds)")


def run(args: argparse.Namespace, allocator: str) -> None:
    """Time every competitor at every size and print the table and the ratios."""
    torch.set_num_threads(1)
    sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
    verl = "" if core_algos is None else ", verl installed"
    print(f"torch {torch.__version__}, 1 thread, allocator {allocator}{verl}")
    header = (
        f"{'B x T, G':>16} {'estimator':>10} {'median ms':>10} {'min ms':>8} {'ns/token':>9} "
        f"{'/slca med':>10} {'/slca min':>10}"
    )
    print(header)
    print("-" * len(header))
    results: dict[tuple[int, int, int], dict[str, tuple[float, float]]] = {}
    for b, t, g in sizes:
        data = make_batch(b, t, g)
        res = measure(competitors(data), args.rounds, args.budget)
        results[(b, t, g)] = res
        med0, min0 = res["slca_grpo"]
        for name, (med, low) in res.items():
            print(
                f"{f'{b} x {t}, {g}':>16} {name:>10} {med * 1e3:10.2f} {low * 1e3:8.2f} "
                f"{med / (b * t) * 1e9:9.3f} {med / med0:10.2f} {low / min0:10.2f}"
            )
        del data
    print()
    for (b, t, g), res in results.items():
        ours = res["slca_grpo"]
        ref = [res["reference"][i] / ours[i] for i in (0, 1)]
        line = (
            f"{b} x {t}, G={g}: reference / slca_grpo = {ref[0]:.1f} (median), {ref[1]:.1f} (min)"
        )
        if "verl_vec" in res:
            vec = [ours[i] / res["verl_vec"][i] for i in (0, 1)]
            line += f"; slca_grpo / verl_vec = {vec[0]:.2f} (median), {vec[1]:.2f} (min)"
        print(line)
    per_token = {k: [r["slca_grpo"][i] / (k[0] * k[1]) for i in (0, 1)] for k, r in results.items()}
    small = next((k for k in per_token if k[:2] == (1024, 4096)), None)
    big = next((k for k in per_token if k[:2] == (4096, 4096)), None)
    if small and big:
        growth = [per_token[big][i] / per_token[small][i] for i in (0, 1)]
        print(
            f"slca_grpo time per token, B=4096 / B=1024: {growth[0]:.2f} (median), "
            f"{growth[1]:.2f} (min)"
        )


if __name__ == "__main__":
    main()
