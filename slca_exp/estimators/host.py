"""Per-rollout vectors on the host.

The estimators' per-rollout arithmetic (group statistics, routing, metrics) runs on (B,) vectors
of a few thousand numbers: numpy does each such step for a fraction of a torch dispatch, and an
estimator call makes some hundred of them. Only the (B, T) work stays in torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def host(values: torch.Tensor | np.ndarray | Sequence[object]) -> np.ndarray:
    """A numpy array of a tensor (a view on CPU, a copy from an accelerator) or an array-like."""
    if isinstance(values, torch.Tensor):
        return values.detach().cpu().numpy()
    return np.asarray(values)
