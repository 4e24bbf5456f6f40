"""``python -m slca_exp.engines.verl.cpu.sft <sft_trainer.yaml>``: verl's SFT trainer on CPU.

verl's own entry point (``verl.trainer.sft_trainer_ray``) calls a bare ``ray.init()``: on a
CPU host that starts a Ray with no GPU slot, where verl's resource pool waits forever, and its
workers would not get the ``cpu`` platform's environment. This entry point joins the run's
Ray cluster (``RAY_ADDRESS``, with its logical GPU slots) with the workers' environment
(:data:`RUNTIME_ENV`, set by the engine), then runs verl's ``SFTTrainer`` on the translated
config exactly as verl's entry point does.
"""

from __future__ import annotations

import json
import os
import sys

RUNTIME_ENV = "SLCA_EXP_RAY_RUNTIME_ENV"
"""JSON of the Ray runtime environment the SFT stage's actors get."""


def main(argv: list[str]) -> int:
    """Run verl's SFT trainer on the config file ``argv[0]``; the exit code."""
    if len(argv) != 1:
        print("usage: python -m slca_exp.engines.verl.cpu.sft <sft_trainer.yaml>", file=sys.stderr)
        return 2
    import ray
    import verl  # noqa: F401 - imports the platform module (VERL_USE_EXTERNAL_MODULES) first
    from omegaconf import OmegaConf
    from verl.trainer.sft_trainer_ray import SFTTrainer

    cfg = OmegaConf.load(argv[0])
    runtime_env = json.loads(os.environ.get(RUNTIME_ENV) or "{}")
    address = os.environ.get("RAY_ADDRESS")
    ray.init(address=address, runtime_env=runtime_env, logging_level="WARNING")
    try:
        SFTTrainer(config=cfg).fit()
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
