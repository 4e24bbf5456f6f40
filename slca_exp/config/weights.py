"""The one rescaling rule of the HierR tool weights (``reward.normalize``).

    reward.tool_weights, reward.normalize=true
      -> validate: the typed config carries the rescaled weights
      -> recipe: the reward component records them
      -> HierRWeights.normalized: the reward scores with them

Every one of them calls :func:`normalized_tool_weights`, so the weights recorded are the weights
that score, to the last bit.
"""

from __future__ import annotations

from collections.abc import Mapping


def normalized_tool_weights(weights: Mapping[str, float]) -> dict[str, float]:
    """The weights rescaled to sum to 1, each divided by their sum, in the order given.

    >>> normalized_tool_weights({"format": 1.0, "name": 3.0})
    {'format': 0.25, 'name': 0.75}

    Raises:
        ValueError: the weights do not sum to a positive number.

    """
    total = sum(weights.values())
    if not total > 0:
        raise ValueError("cannot normalise tool weights that sum to 0")
    return {name: value / total for name, value in weights.items()}
