"""What every verl process imports: slca-exp's estimators and trainer in verl's registries.

verl imports this module on ``import verl`` in two ways, both set up by slca-exp:

- ``VERL_USE_EXTERNAL_MODULES=slca_exp.engines.verl.plugin``, forwarded to every Ray worker
  through ``ray_kwargs.ray_init.runtime_env.env_vars`` (the TaskRunner that computes the
  advantages is a Ray actor, not the driver);
- the ``verl.plugins`` entry point of this package (``pyproject.toml``), wherever slca-exp is
  installed (verl skips an entry point that fails to load, silently: hence the check below).

Importing it registers ``slca_grpo`` and ``toolpo_grpo`` (``estimators.py``) and the trainer
``slca_sync`` (``trainer.py``: verl's synchronous trainer plus our per-segment metrics).

:func:`check_registered` is the early, loud check: it starts a fresh Python with the
environment a verl worker gets, imports verl there, and fails before anything launches, naming
the module to import, when an estimator or the trainer is missing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence

from slca_exp.engines.verl.estimators import NAMES, register
from slca_exp.engines.verl.keys import MODULES_ENV
from slca_exp.engines.verl.trainer import TRAINER_MODE

MODULE = __name__
"""The module verl must import (``VERL_USE_EXTERNAL_MODULES``; ``keys.PLUGIN_MODULE``)."""
ENV_VAR = MODULES_ENV

REGISTERED = register()
"""The estimator names this import added to verl's registry."""


_MARK = "slca-exp missing: "  # the probe's answer line (verl may print on import)


class RegistrationError(RuntimeError):
    """verl would not find an estimator slca-exp needs (raised before training starts)."""


def worker_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables verl's Ray workers need: ``VERL_USE_EXTERNAL_MODULES`` naming this module.

    Args:
        base: variables already forwarded (their module list is kept; ours is added once).

    """
    env = dict(base or {})
    modules = [m for m in env.get(ENV_VAR, "").split(",") if m.strip()]
    if MODULE not in modules:
        modules.append(MODULE)
    env[ENV_VAR] = ",".join(modules)
    return env


def check_registered(
    names: Sequence[str],
    env: Mapping[str, str] | None = None,
    *,
    trainer_mode: str | None = None,
    python: str = sys.executable,
    timeout_s: float = 300.0,
) -> None:
    """Fail unless a fresh verl process with ``env`` knows every estimator in ``names``.

    Args:
        names: ``algorithm.adv_estimator`` values the run needs (verl's own are known anyway).
        env: the variables the workers get on top of this process's (``runtime_env``).
        trainer_mode: ``trainer.v1.trainer_mode``; checked too when it is ours.
        python: the interpreter of the workers' environment.
        timeout_s: how long importing verl may take.

    Raises:
        RegistrationError: the message names the missing estimator (or trainer), the module that
            registers it and how to make verl import it (or the import error of that module).

    """
    wanted = [n for n in names if n in NAMES]
    trainers = [trainer_mode] if trainer_mode == TRAINER_MODE else []
    if not (wanted or trainers):
        return
    child_env = {**os.environ, **(env or {})}
    probe = (
        "import sys\n"
        "from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY\n"
        "from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY\n"
        f"missing = [n for n in {wanted!r} if n not in ADV_ESTIMATOR_REGISTRY]\n"
        f"missing += ['trainer ' + n for n in {trainers!r} if n not in TRAINER_REGISTRY]\n"
        f"print({_MARK!r} + ','.join(missing))\n"
    )
    try:
        res = subprocess.run(
            [python, "-c", probe],
            env=child_env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise RegistrationError(
            f"could not start a verl process to check the estimators: {err}"
        ) from err
    how = (
        f"set {ENV_VAR}={MODULE} in the workers' environment (slca-exp forwards it through "
        "ray_kwargs.ray_init.runtime_env.env_vars) and install slca-exp where they run"
    )
    if res.returncode != 0:
        tail = "\n".join(res.stderr.strip().splitlines()[-5:])
        raise RegistrationError(
            f"importing verl with {ENV_VAR}={child_env.get(ENV_VAR, '')!r} failed, so "
            f"{', '.join(wanted + trainers)} cannot be registered (module {MODULE}):\n{tail}\n"
            f"fix: {how}"
        )
    answer = [line for line in res.stdout.splitlines() if line.startswith(_MARK)]
    missing = [m for m in answer[-1][len(_MARK) :].split(",") if m] if answer else []
    if missing:
        raise RegistrationError(
            f"verl does not know {', '.join(missing)} (advantage estimator / trainer.v1."
            f"trainer_mode): module {MODULE} was not imported by verl; fix: {how}"
        )
