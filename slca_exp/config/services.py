"""The schemas of the frozen services a run asks: the summary judge and the tool simulator.

Each is a model answering over an OpenAI-compatible HTTP API, or a CPU stand-in
(:class:`ServiceConfig`); :mod:`slca_exp.config.schema` composes them into a run.
"""

from __future__ import annotations

from dataclasses import dataclass

from slca_exp.config.fields import param


@dataclass
class ServiceConfig:
    """A frozen model answering over an OpenAI-compatible HTTP API, or a CPU stand-in."""

    name: str = param("", "identifier recorded with the run")
    backend: str = param("", "implementation (see the group's options)")
    model: str | None = param(None, "served model name (HTTP backends)")
    base_url: str | None = param(None, "OpenAI-compatible endpoint, e.g. http://host:8000/v1")
    service: str | None = param(
        None,
        "a service started with `slca-exp serve up` (its registry name): the run finds its "
        "endpoint at job start and checks what it serves; base_url is then ignored",
    )
    service_registry: str | None = param(
        None, "the service registry folder; null: $SLCA_EXP_SERVICES, else ~/.slca-exp/services"
    )
    service_wait_s: float = param(
        600.0, "how long a job waits at start for its service to answer", gt=0, finite=True
    )
    api_key_env: str | None = param(None, "NAME of the env var holding the API key (never the key)")
    prompt: str | None = param(
        None, "prompt template: a file, or a name in the package's prompts/ (sha256 recorded)"
    )
    prompt_version: str | None = param(None, "prompt version recorded with the run")
    temperature: float = param(0.0, "sampling temperature", ge=0)
    max_tokens: int = param(1024, "completion budget", gt=0)
    timeout_s: float = param(60.0, "per-request timeout in seconds (whole request)", gt=0)
    max_retries: int = param(3, "retries on 5xx, 429, timeouts and transport errors", ge=0)
    backoff: str = param(
        "linear",
        "delay before retry k: linear (k * backoff_s) | exponential (2^(k-1) * backoff_s)",
        choices=("linear", "exponential"),
    )
    backoff_s: float = param(1.0, "base delay between retries in seconds", ge=0, finite=True)
    concurrency: int = param(8, "requests in flight at once", gt=0)
    cache: bool = param(True, "reuse answers from the persistent cache")
    cache_path: str | None = param(
        None, "sqlite cache file; default $SLCA_EXP_CACHE_DIR/services.sqlite or ~/.cache/slca-exp/"
    )


@dataclass
class JudgeNoiseConfig:
    """A perturbation of the judge's ratings, for studies of a noisy judge (off by default).

    The draw for a rollout is seeded by ``seed`` and the rollout's text, so a rerun gets the same
    perturbed ratings; the judge's cache keeps the raw ones.
    """

    kind: str = param(
        "none",
        "none | gaussian (rating + N(0, std), rounded half up, clipped to 1..5) | flip (with "
        "probability p the rating is replaced by a uniform draw from 1..5)",
        choices=("none", "gaussian", "flip"),
    )
    std: float = param(1.0, "gaussian: the noise's standard deviation, in rating points", ge=0)
    p: float = param(0.5, "flip: the probability that a rating is replaced", ge=0, le=1)
    seed: int | None = param(None, "the draws' seed; null: the run's seed")


@dataclass
class JudgeConfig(ServiceConfig):
    """The summary judge (recorded component 3 of 5)."""

    name: str = param("rubric", "identifier recorded with the run")
    backend: str = param(
        "rubric",
        "registered judge: rubric (deterministic CPU) | openai (HTTP) | a plugin's",
    )
    max_tokens: int = param(8192, "completion budget", gt=0)
    rubric_version: str = param(
        "v2",
        "the rubric judge's rule (judge.backend=rubric only): v2 rates a reply on the facts of "
        "the tool responses it states (markup, JSON, an echo of the question or a reply stating "
        "none of the facts rate 1; each invented number costs a point) | v1 the first rule, "
        "kept so that runs made with it reproduce",
        choices=("v1", "v2"),
    )
    short_circuit_no_tool_response: bool = param(
        True, "score 0 without asking the judge when the rollout has no tool response"
    )
    min_reply_chars: int = param(
        10, "score 0 without asking the judge when the final reply is shorter (0: off)", ge=0
    )
    noise: JudgeNoiseConfig = param(
        default_factory=JudgeNoiseConfig, help="perturb the judge's ratings (kind=none: off)"
    )


@dataclass
class SimulatorConfig(ServiceConfig):
    """The tool simulator (recorded component 4 of 5)."""

    name: str = param("replay", "identifier recorded with the run")
    backend: str = param(
        "replay",
        "registered simulator: replay (deterministic) | sgls (schema-guided LLM over HTTP) | a "
        "plugin's",
    )
    temperature: float = param(0.6, "sampling temperature", ge=0)
    check_required_args: bool = param(True, "refuse calls missing required schema arguments")
    check_types: bool = param(
        True, "refuse arguments whose JSON type or enum value contradicts the schema"
    )
    schema_guidance: bool = param(
        True,
        "the simulator is given the called tool's schema: sgls shows it in its prompt, and "
        "calls are checked against it (check_required_args, check_types) before anyone answers. "
        "false: the w/o-SGLS ablation, the simulator sees only the tool's name and arguments, no "
        "call is refused for its arguments, and sgls's default prompt is sgls_no_schema_v1.txt",
    )
