"""Estimator speed, side by side in one process, one CPU thread.

Competitors on the same verl-shaped batch (int64 response mask with multi-turn structure, uid
strings as group ids, the score on the last response token):

  slca_grpo   slca_exp.estimators.slca_grpo_advantages
  grpo        slca_exp.estimators.grpo_advantages
  verl_grpo   verl's compute_grpo_outcome_advantage (loop over samples)
  verl_vec    verl's compute_grpo_vectorized_outcome_advantage
  reference   the tests' per-sample reference loop of SLCA-GRPO (tests/estimators/reference.py)

Rounds are interleaved (every competitor once per round) and the median is reported, so slow
drift of the machine hits all competitors alike. Usage:

    python benchmarks/estimators.py [--sizes 256x2048x8,1024x4096x16,4096x4096x16] [--rounds 15]
"""

from __future__ import annotations

import argparse
import statistics
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


def measure(fns: dict[str, Callable[[], object]], rounds: int, budget_s: float) -> dict[str, float]:
    """Median seconds per call; slow competitors get fewer rounds (at least 3)."""
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
    return {n: statistics.median(t) for n, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes", default=DEFAULT_SIZES, help="BxTxG,... (rollouts x tokens x group)"
    )
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds per size")
    parser.add_argument("--budget", type=float, default=3.0, help="seconds per slow competitor")
    args = parser.parse_args()
    torch.set_num_threads(1)
    sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
    print(
        f"torch {torch.__version__}, 1 thread" + ("" if core_algos is None else ", verl installed")
    )
    header = f"{'B x T, G':>18} {'estimator':>10} {'median ms':>10} {'ns/token':>9} {'/slca':>7}"
    print(header)
    print("-" * len(header))
    per_token: dict[tuple[int, int, int], float] = {}
    results: dict[tuple[int, int, int], dict[str, float]] = {}
    for b, t, g in sizes:
        data = make_batch(b, t, g)
        res = measure(competitors(data), args.rounds, args.budget)
        results[(b, t, g)] = res
        per_token[(b, t, g)] = res["slca_grpo"] / (b * t)
        for name, sec in res.items():
            print(
                f"{f'{b} x {t}, {g}':>18} {name:>10} {sec * 1e3:10.2f} "
                f"{sec / (b * t) * 1e9:9.3f} {sec / res['slca_grpo']:7.2f}"
            )
        del data
    print()
    for (b, t, g), res in results.items():
        speedup = res["reference"] / res["slca_grpo"]
        line = f"{b} x {t}, G={g}: reference / slca_grpo = {speedup:.1f}"
        if "verl_vec" in res:
            line += f"; slca_grpo / verl_vec = {res['slca_grpo'] / res['verl_vec']:.2f}"
        print(line)
    keys = list(per_token)
    small = next((k for k in keys if k[:2] == (1024, 4096)), None)
    big = next((k for k in keys if k[:2] == (4096, 4096)), None)
    if small and big:
        print(f"time per token at B=4096 / at B=1024: {per_token[big] / per_token[small]:.2f}")


if __name__ == "__main__":
    main()
