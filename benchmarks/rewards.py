"""Reward speed, side by side in one process.

Part 1, the tool process reward on Toucan-shaped rollouts (one to three calls, think blocks, tool
responses, a final reply, a mix of right, wrong, parallel, missing and malformed calls):

  naive_paper   a straightforward regex-and-json implementation of the paper variant, written
                here the way the public reward reads (regexes over the text, greedy matching)
  paper         slca_exp.rewards.tool_process_reward(variant="paper")
  strict        slca_exp.rewards.tool_process_reward(variant="strict")
  strict_gold   strict, with the ground truth read once per group (how HierRReward calls it)

Rounds are interleaved; the best round of each is reported as rollouts per second on one core.

Part 2, the judge client (``openai`` judge over services/client.py) against the loopback
OpenAI-compatible server in a separate process, answering every request after a fixed latency:
512 distinct requests at concurrency 32 (ideal: 512 / 32 x latency), then the same 512 again,
answered from the persistent cache (cache hits per second).

    python benchmarks/rewards.py [--rollouts 4000] [--rounds 5] [--latency-ms 50] [--requests 512]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slca_exp.rewards import read_gold, tool_process_reward  # noqa: E402

TOOLS = ["get_weather", "get_time", "search_flights", "convert_currency", "get_stock", "translate"]


# --- the competitor: a plain regex-and-json paper variant -------------------------------------

_THINK = re.compile(r"<think>.*?</think>|<thinking>.*?</thinking>", re.S)
_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


def _loose(a, b):
    if a is None and b is None:
        return True
    if isinstance(a, bool) or isinstance(b, bool):
        return str(a).strip().lower() in ("true", "1") == (str(b).strip().lower() in ("true", "1"))
    if isinstance(a, int | float) and isinstance(b, int | float):
        return abs(a - b) < 1e-9
    if isinstance(a, list | dict) or isinstance(b, list | dict):
        return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    return str(a).strip().lower() == str(b).strip().lower()


def naive_paper_reward(text, gt):
    text = _THINK.sub("", text)
    gold = gt["gold_tool_calls"]
    if isinstance(gold, str):
        gold = json.loads(gold)
    steps = gold if gold and isinstance(gold[0], list) else [gold]
    gold_calls = [c for s in steps for c in s]
    if gold_calls and "<tool_call>" not in text:
        return -0.5
    allowed = set(gt["allowed_tools"])
    n_open, n_close = text.count("<tool_call>"), text.count("</tool_call>")
    valid_blocks = []
    for content in _BLOCK.findall(text):
        try:
            obj = json.loads(content)
        except ValueError:
            continue
        calls = obj if isinstance(obj, list) else [obj]
        ok = all(
            isinstance(c, dict)
            and isinstance(c.get("name"), str)
            and c["name"] in allowed
            and isinstance(c.get("arguments", c.get("parameters", {})), dict)
            for c in calls
        )
        if ok:
            valid_blocks.append(calls)
    denom = max(n_open, n_close)
    fmt = len(valid_blocks) / denom if denom else 0.0
    preds = [c for b in valid_blocks for c in b]
    pn, gn = [c["name"] for c in preds], [c["name"] for c in gold_calls]
    if not pn and not gn:
        name = 1.0
    elif not pn or not gn:
        name = 0.0
    else:
        rest, overlap = list(gn), 0
        for n in pn:
            if n in rest:
                rest.remove(n)
                overlap += 1
        name = 2 * overlap / (len(pn) + len(gn))
    with_args = [g for g in gold_calls if g.get("arguments")]
    if not with_args:
        key = value = 1.0
    elif not preds:
        key = value = 0.0
    else:
        used, ks, vs = set(), [], []
        for g in with_args:
            best, best_i = (0.0, 0.0), None
            for i, p in enumerate(preds):
                if i in used or p["name"] != g["name"]:
                    continue
                ga, pa = g["arguments"], p.get("arguments", p.get("parameters", {}))
                k = len(ga.keys() & pa.keys()) / len(ga.keys() | pa.keys())
                v = sum(_loose(ga[x], pa[x]) for x in ga.keys() & pa.keys()) / len(ga)
                if best_i is None or k + v > sum(best):
                    best, best_i = (k, v), i
            if best_i is not None:
                used.add(best_i)
            ks.append(best[0])
            vs.append(best[1])
        key, value = sum(ks) / len(ks), sum(vs) / len(vs)
    parallel = float(
        len(steps[0] if steps else []) == (len(valid_blocks[0]) if valid_blocks else 0)
    )
    return 0.1 * fmt + 0.25 * name + 0.15 * key + 0.2 * value + 0.3 * parallel


# --- Toucan-shaped data ------------------------------------------------------------------------


def _args(rng):
    return {
        "city": rng.choice(["Paris", "Lyon", "Oslo", "Lima"]),
        "unit": rng.choice(["celsius", "fahrenheit"]),
        **({"days": rng.randint(1, 7)} if rng.random() < 0.5 else {}),
    }


def make_rollouts(n, seed=0):
    """(response, ground truth) pairs; rollouts of one prompt share their ground truth object."""
    rng = random.Random(seed)
    pairs = []
    while len(pairs) < n:
        k = rng.choice([1, 1, 2, 3])
        gold = [{"name": rng.choice(TOOLS), "arguments": _args(rng)} for _ in range(k)]
        gt = {
            "allowed_tools": TOOLS,
            "gold_tool_calls": json.dumps([gold]),
            "question_content": "What is the weather like?",
            "subset_name": "tool_call",
        }
        for _ in range(16):
            kind = rng.random()
            calls = [dict(c) for c in gold]
            if kind < 0.15:
                calls = calls[:-1] or calls
            elif kind < 0.3:
                calls[0] = {"name": calls[0]["name"], "arguments": _args(rng)}
            tags = "".join(f"<tool_call>\n{json.dumps(c)}\n</tool_call>\n" for c in calls)
            if kind > 0.9:
                tags = tags.replace("}}", "}", 1)  # a malformed block
            if kind > 0.95:
                tags = ""  # no call at all
            reply = '<|im_start|>user\n<tool_response>\n{"temp": 18, "sky": "clear"}\n'
            reply += "</tool_response><|im_end|>\n<|im_start|>assistant\n"
            reply += "It is 18 degrees and clear in " + calls[0]["arguments"]["city"] + "."
            pairs.append((f"<think>I should call {k} tools.</think>\n{tags}{reply}", gt))
    return pairs[:n]


def bench_tool_reward(n, rounds):
    pairs = make_rollouts(n)
    golds = {}
    gold_pairs = [(t, golds.setdefault(id(gt), read_gold(gt))) for t, gt in pairs]
    competitors = {
        "naive_paper": lambda: [naive_paper_reward(t, gt) for t, gt in pairs],
        "paper": lambda: [tool_process_reward(t, gt, variant="paper") for t, gt in pairs],
        "strict": lambda: [tool_process_reward(t, gt, variant="strict") for t, gt in pairs],
        "strict_gold": lambda: [tool_process_reward(t, g, variant="strict") for t, g in gold_pairs],
    }
    # The two paper implementations must agree before their speeds mean anything.
    mine = competitors["paper"]()
    naive = competitors["naive_paper"]()
    assert all(abs(a.score - b) < 1e-9 for a, b in zip(mine, naive, strict=True)), "paper mismatch"
    best = dict.fromkeys(competitors, float("inf"))
    for _ in range(rounds):
        for name, fn in competitors.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    print(f"tool_process_reward, {n} Toucan-shaped rollouts, best of {rounds} rounds, one core")
    print(f"{'competitor':<12} {'rollouts/s':>12} {'us/rollout':>11} {'vs naive_paper':>15}")
    for name, secs in best.items():
        ratio = best["naive_paper"] / secs
        print(f"{name:<12} {n / secs:>12,.0f} {1e6 * secs / n:>11.1f} {ratio:>14.2f}x")
    return {name: n / secs for name, secs in best.items()}


# --- the judge client --------------------------------------------------------------------------


def bench_judge(requests, latency_ms, concurrency=32):
    from slca_exp.config.services import JudgeConfig
    from slca_exp.judges import build_judge
    from slca_exp.judges.base import JudgeRequest
    from slca_exp.services.loopback import serve_in_subprocess

    answer = "<response_quality><reasoning>fine</reasoning><rating>good</rating></response_quality>"
    batch = [
        JudgeRequest(
            f"question {i}",
            f"<tool_call>{{}}</tool_call><tool_response>{i}</tool_response>A reply about {i}.",
        )
        for i in range(requests)
    ]
    with (
        tempfile.TemporaryDirectory() as tmp,
        serve_in_subprocess(content=answer, latency_s=latency_ms / 1000) as server,
    ):
        cfg = JudgeConfig(
            backend="openai",
            name="openai",
            model="bench-judge",
            base_url=server.base_url,
            concurrency=concurrency,
            cache_path=str(Path(tmp) / "cache.sqlite"),
        )
        with build_judge(cfg) as judge:
            judge.score(batch[:concurrency])  # warm the connection pool
            fresh = [JudgeRequest(r.question + " (timed)", r.response_text) for r in batch]
            t0 = time.perf_counter()
            results = judge.score(fresh)
            cold = time.perf_counter() - t0
            assert all(r.status == "ok" for r in results), {r.status for r in results}
            t0 = time.perf_counter()
            results = judge.score(fresh)
            warm = time.perf_counter() - t0
            assert all(r.cached for r in results)
    ideal = requests / concurrency * latency_ms / 1000
    print(
        f"\njudge client: {requests} requests, concurrency {concurrency}, "
        f"{latency_ms:g} ms server latency"
    )
    print(f"  cold: {cold:.3f} s (ideal {ideal:.3f} s, {cold / ideal:.2f}x ideal; target <= 1.25x)")
    print(f"  cache hits: {requests / warm:,.0f} per second (target >= 20,000)")
    return cold / ideal, requests / warm


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--skip-judge", action="store_true")
    args = parser.parse_args(argv)
    bench_tool_reward(args.rollouts, args.rounds)
    if not args.skip_judge:
        bench_judge(args.requests, args.latency_ms)


if __name__ == "__main__":
    main()
