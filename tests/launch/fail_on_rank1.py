"""A plugin module (``SLCA_EXP_PLUGINS``) that breaks task 1 of a multi-task job on purpose.

Every task imports the plugins while it prepares the job; on rank 1 this one raises, as a module
missing from one node's environment would.
"""

import os

if os.environ.get("SLURM_PROCID") == "1":
    raise RuntimeError("deliberate failure on rank 1 (tests/launch/fail_on_rank1.py)")
