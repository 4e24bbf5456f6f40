"""The workers' environment is text, whatever an override made of a value.

``engine.verl.overrides=['ray_kwargs.ray_init.runtime_env.env_vars.OMP_NUM_THREADS=1']`` reads
as the integer 1; the environment handed to the registration check's subprocess and to Ray must
hold the string "1" (a number there stopped the run with a TypeError).
"""

import os
import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from slca_exp.engines.verl.tracker_runs import tracker_env

NAMES = st.from_regex(r"[A-Z][A-Z0-9_]{0,12}", fullmatch=True)
VALUES = st.one_of(
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12),
)


@settings(max_examples=50, deadline=None)
@given(base=st.dictionaries(NAMES, VALUES, max_size=6), ids=st.sampled_from([{}, {"mlflow": "r1"}]))
def test_every_variable_is_text_and_keeps_its_value(base, ids):
    env = tracker_env(ids, base)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    for name, value in base.items():
        if name != "MLFLOW_RUN_ID" or not ids:
            assert env[name] == str(value)
    if ids:
        assert env["MLFLOW_RUN_ID"] == "r1"


def test_a_number_from_an_override_reaches_a_subprocess_as_text():
    env = tracker_env({"mlflow": "r1"}, {"OMP_NUM_THREADS": 1})
    out = subprocess.run(
        [sys.executable, "-c", "import os; print(os.environ['OMP_NUM_THREADS'])"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "1"
