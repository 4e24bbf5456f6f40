"""``slca-exp`` with the synthetic engine registered as ``local`` (for subprocess tests)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from slca_exp.cli import main  # noqa: E402
from slca_exp.engines import ENGINES  # noqa: E402
from tests.tracking.synthetic import SyntheticEngine  # noqa: E402

if __name__ == "__main__":
    ENGINES.register("local", SyntheticEngine())
    sys.exit(main(sys.argv[1:]))
