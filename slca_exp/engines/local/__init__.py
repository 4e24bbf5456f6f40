"""The local engine (``engine=local``): SFT then GRPO-family RL on CPU or one GPU."""
