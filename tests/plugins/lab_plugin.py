"""A plugin module (``SLCA_EXP_PLUGINS``): registers the lab's judge, simulator, tracker and data
source (``tests/plugins/lab.py``) under the name ``lab``.

Every process that imports it registers the same entries, so jobs that run elsewhere find them
too; tests import ``tests.plugins.lab`` instead, which registers nothing.
"""

from slca_exp.data.sources import DATA_SOURCES
from slca_exp.judges import JUDGES
from slca_exp.simulators import SIMULATORS
from slca_exp.tracking import TRACKERS, TrackerBackend
from tests.plugins.lab import NAME, LabJudge, LabSimulator, LabSource, LabTracker

if NAME not in DATA_SOURCES:
    DATA_SOURCES.register(NAME, LabSource())
if NAME not in SIMULATORS:
    SIMULATORS.register(NAME, LabSimulator)
if NAME not in JUDGES:
    JUDGES.register(NAME, LabJudge)
if NAME not in TRACKERS:
    TRACKERS.register(NAME, TrackerBackend(LabTracker, keeps_files=True))
