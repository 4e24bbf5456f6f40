"""Experiment tracking: metric names now; trackers (MLflow, W&B, console) build on them."""
