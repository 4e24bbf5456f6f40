"""The skip policy under CI, and the package's doctests start from a collected heap.

Under CI a test may skip only for a reason on ``tests/ci_allowed_skips.txt``; any other skip
fails the run (``tests/skip_policy.py``).

The package's doctests (``--doctest-modules`` over ``slca_exp``) start from a collected heap.

SQLAlchemy keeps the source of the classes it generates (MLflow's store migrations make some) in
``linecache`` and drops each entry when its class is garbage-collected. Every doctest begins with
``linecache.checkcache()``, which walks that cache: a collection that ran in the middle of the
walk would remove an entry under it (a ``KeyError`` in the standard library). Collecting first
leaves no such class pending.
"""

import gc

import pytest
from _pytest.doctest import DoctestItem

pytest_plugins = ["tests.skip_policy"]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    """Collect garbage right before each doctest runs."""
    if isinstance(item, DoctestItem):
        gc.collect()
