"""``slca-exp`` with the synthetic engine registered as ``synthetic`` and selected (for
subprocess tests of the trackers that do not need a real training run)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from slca_exp.commands import main  # noqa: E402
from slca_exp.engines import ENGINES  # noqa: E402
from tests.tracking.synthetic import SyntheticEngine  # noqa: E402

if __name__ == "__main__":
    ENGINES.register("synthetic", SyntheticEngine())
    args = sys.argv[1:]
    if args and args[0] in ("train", "validate"):
        args.append("engine.name=synthetic")
    sys.exit(main(args))
