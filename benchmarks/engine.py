"""Local engine speed: rollout tokens per second and where an RL step's time goes.

Runs the smoke recipe's pieces (synthetic split, the tiny backbone after a short SFT, the replay
simulator, the rubric judge, HierR, SLCA-GRPO, the clipped PG update) for a few RL steps and
prints the per-phase time of a step (generate, simulate, reward, advantage, update) as a table.
Side by side, the same rollouts generated without the KV cache show what the cache buys.

    python benchmarks/engine.py [--steps 8] [--group 8] [--prompts 4] [--sft-steps 150]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from slca_exp.engines.local import data_io  # noqa: E402
from slca_exp.engines.local.rollout import Roller, RolloutSettings  # noqa: E402
from slca_exp.engines.local.sft import train_sft  # noqa: E402
from slca_exp.engines.local.update import rl_update  # noqa: E402
from slca_exp.estimators import EstimatorParams, get_estimator  # noqa: E402
from slca_exp.judges import build_judge  # noqa: E402
from slca_exp.preflight.compose import compose_run  # noqa: E402
from slca_exp.preflight.validate import validate  # noqa: E402
from slca_exp.rewards import HierRReward  # noqa: E402
from slca_exp.simulators import build_simulator  # noqa: E402

PHASES = ("generate", "simulate", "reward", "advantage", "update")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--sft-steps", type=int, default=150)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = validate(compose_run([f"tracking.root={tmp}"]))
        splits = data_io.load(cfg)
        backbone = data_io.backbone(cfg, splits, torch.device("cpu"))
        model, tok = backbone.model, backbone.tokenizer
        examples = data_io.sft_examples(tok, splits["sft"].rows, cfg.engine.sft.max_len)
        sft = type(cfg.engine.sft)(steps=args.sft_steps, batch_size=16, lr=3e-3)
        train_sft(model, examples, sft, seed=0, pad_id=tok.pad_token_id)
        roller = Roller(
            model,
            tok,
            build_simulator(cfg.simulator),
            data_io.render_prompt,
            data_io.tool_turn_text,
        )
        judge = build_judge(cfg.judge)
        reward = HierRReward.from_config(cfg.reward)
        estimator, params = get_estimator("slca_grpo"), EstimatorParams()
        r = cfg.engine.rollout
        settings = RolloutSettings(r.max_turns, r.max_turn_tokens, r.max_response_tokens, 0.8)
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.engine.rl.lr)
        rows = splits["train"].rows
        times = {p: [] for p in PHASES}
        tokens, generated = [], []
        for step in range(args.steps):
            batch_rows = rows[step * args.prompts : (step + 1) * args.prompts]
            torch.manual_seed(step)
            rolls = roller.run(batch_rows, args.group, settings)
            t0 = time.perf_counter()
            scored = reward.score(
                rolls.texts, [x["reward_model"]["ground_truth"] for x in rolls.rows], judge
            )
            t1 = time.perf_counter()
            packed = rolls.batch(roller.pad_id)
            adv = estimator(packed.response_mask, rolls.group, scored.scores, params)
            t2 = time.perf_counter()
            model.train()
            rl_update(model, None, optimizer, packed, adv, cfg.engine.rl, 0.8)
            model.eval()
            t3 = time.perf_counter()
            times["generate"].append(rolls.timings["generate"])
            times["simulate"].append(rolls.timings["simulate"])
            times["reward"].append(t1 - t0)
            times["advantage"].append(t2 - t1)
            times["update"].append(t3 - t2)
            tokens.append(sum(map(len, rolls.response_ids)))
            generated.append(sum(sum(m) for m in rolls.response_mask))
        step_s = [sum(times[p][i] for p in PHASES) for i in range(args.steps)]
        print(
            f"RL step, {args.prompts} prompts x {args.group} samples, tiny backbone, 1 thread, "
            f"mean of {args.steps} steps"
        )
        print(f"{'phase':<10} {'ms/step':>9} {'share':>7}")
        total = statistics.mean(step_s)
        for p in PHASES:
            ms = statistics.mean(times[p]) * 1000
            print(f"{p:<10} {ms:>9.1f} {ms / 10 / total:>6.1f}%")
        print(f"{'step':<10} {total * 1000:>9.1f}")
        gen = sum(times["generate"])
        print(f"rollout tokens/s (generated + injected): {sum(tokens) / gen:,.0f}")
        print(f"generated tokens/s: {sum(generated) / gen:,.0f}")

        # The same rollouts without the KV cache: every new token re-reads the whole context.
        model.generation_config.use_cache = False
        torch.manual_seed(0)
        t0 = time.perf_counter()
        uncached = roller.run(rows[: args.prompts], args.group, settings)
        slow = time.perf_counter() - t0
        model.generation_config.use_cache = True
        torch.manual_seed(0)
        t0 = time.perf_counter()
        cached = roller.run(rows[: args.prompts], args.group, settings)
        fast = time.perf_counter() - t0
        assert cached.response_ids == uncached.response_ids, "cache changed the samples"
        print(
            f"\ngeneration with KV cache {fast:.2f} s vs without {slow:.2f} s: "
            f"{slow / fast:.2f}x faster (same samples)"
        )


if __name__ == "__main__":
    main()
