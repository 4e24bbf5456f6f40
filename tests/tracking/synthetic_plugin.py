"""A plugin module (``SLCA_EXP_PLUGINS``) that installs the synthetic engine as ``synthetic``.

Jobs launched through submitit run in fresh processes; they import this module themselves
because the variable travels with the environment.
"""

from slca_exp.engines import ENGINES
from tests.tracking.synthetic import SyntheticEngine

ENGINES.register("synthetic", SyntheticEngine())
