"""Keep what runs write (MLflow stores, generated splits, caches) out of the checkout."""

import pytest


@pytest.fixture(autouse=True, scope="session")
def _output_root(tmp_path_factory):
    """``SLCA_EXP_ROOT`` (the default ``tracking.root``) in a temporary folder for the session."""
    mp = pytest.MonkeyPatch()
    mp.setenv("SLCA_EXP_ROOT", str(tmp_path_factory.mktemp("slca-exp-root")))
    yield
    mp.undo()
