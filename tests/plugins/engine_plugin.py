"""A plugin module (``SLCA_EXP_PLUGINS``) that installs ``counter``: an engine with its own keys.

Its schema extends the engine's with ``engine.counter`` (``steps``, ``value``, each with its field
check); its option file (``tests.plugins.lab.COUNTER_OPTION``, written by the test into a
``--config-dir`` folder) merges onto that schema; it has its own check and a ``describe``. It
logs ``reward/tool/mean`` = ``value * step`` for ``steps`` steps: no model, no torch.
"""

from dataclasses import dataclass

from slca_exp.config.fields import param
from slca_exp.config.schema import EngineConfig
from slca_exp.core import names
from slca_exp.core.problems import Problem
from slca_exp.engines import ENGINES, Engine
from tests.plugins.lab import UNLUCKY


@dataclass
class CounterSettings:
    """``engine.counter``: the counter engine's own settings."""

    steps: int = param(3, "steps to log", gt=0)
    value: float = param(1.0, "the logged reward per step", finite=True)


@dataclass
class CounterEngineConfig(EngineConfig):
    """``engine=counter``: every engine key, and ``engine.counter``."""

    counter: CounterSettings = param(default_factory=CounterSettings, help="the counter's own")


class CounterEngine(Engine):
    """Logs ``value * step`` as the tool reward for ``engine.counter.steps`` steps."""

    schema = CounterEngineConfig

    def check(self, config, recipe=None):
        if config.engine.counter.value == UNLUCKY:
            return [Problem("engine.counter.value", "13 is unlucky", "pick another value")]
        return []

    def describe(self, config, *, write):
        return f"# engine=counter: {config.engine.counter.steps} steps\n"

    def run(self, config, recipe, tracker):
        settings = config.engine.counter
        for step in range(settings.steps):
            tracker.log_metrics({names.REWARD_TOOL_MEAN: settings.value * step}, step)
        return {"steps": settings.steps}


if "counter" not in ENGINES:
    ENGINES.register("counter", CounterEngine())
