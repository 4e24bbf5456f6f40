"""Whether each reachable judge and simulator server can take the run's requests at all.

A server that answers reports its models' ``max_model_len``; a ``<group>.max_tokens`` that
leaves no room under it for the group's prompt would have every request refused
(:mod:`slca_exp.services.limits`). Checked by ``validate`` and ``train --dry-run`` (with the
reachability probe) and at a job's start, before its first step. A server that does not answer
is not this check's problem: the probe reports it before a run, and at a job's start the
service's wait (``<group>.service_wait_s``) or the requests' own failures do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from slca_exp.core.problems import Problem
from slca_exp.preflight.sections import SERVICES, is_remote

ASK_TIMEOUT_S = 3.0
"""How long asking a server for its models may take here."""


def served_limit_problems(
    configs: Sequence[Any],  # RunConfig
    served: Mapping[str, Any] | None = None,  # group -> Resolved, from resolve_services
    timeout_s: float = ASK_TIMEOUT_S,
) -> list[Problem]:
    """Every ``<group>.max_tokens`` that does not fit its server's ``max_model_len``.

    Args:
        configs: the runs' configs (one problem per distinct server, model and budget).
        served: what resolving the run's named services found (their servers already asked).
        timeout_s: how long one question to a server may take.

    """
    from slca_exp.services.limits import count_prompt_tokens, length_problems
    from slca_exp.services.served import ServiceUnreachable, ask_server

    problems: list[Problem] = []
    seen: set[tuple[str, str, str, int, str]] = set()
    for config in configs:
        for group in SERVICES:
            svc = getattr(config, group)
            url, model = str(svc.base_url or ""), str(svc.model or "")
            if not is_remote(group, svc.backend) or not url or not model:
                continue
            template = _prompt_text(group, svc)
            key = (group, url, model, int(svc.max_tokens), template)
            if key in seen:
                continue
            seen.add(key)
            resolved = (served or {}).get(group)
            answer = resolved.served if resolved is not None else None
            if answer is None:
                try:
                    answer = ask_server(url, svc.api_key_env, timeout_s=timeout_s)
                except ServiceUnreachable:
                    continue
            card = answer.card(model)
            if card is None or not isinstance(card.get("max_model_len"), int):
                continue
            from slca_exp.services.prompts import literal_text

            tokens = count_prompt_tokens(url, model, literal_text(template), svc.api_key_env)
            problems += length_problems(group, int(svc.max_tokens), card, url, tokens)
    return problems


def _prompt_text(group: str, svc: Any) -> str:  # noqa: ANN401 - JudgeConfig or SimulatorConfig
    """The group's prompt template, as its registered backend loads it ("" when it has none)."""
    from slca_exp.judges import JUDGES
    from slca_exp.simulators import SIMULATORS

    registry = JUDGES if group == "judge" else SIMULATORS
    try:
        return str(registry.get(svc.backend).prompt_text(svc))
    except Exception:  # noqa: BLE001 - a missing template is the recipe check's problem
        return ""
