"""A served model's context length against what a run asks of it.

vLLM refuses a completion whose prompt and ``max_tokens`` together exceed the model's
``max_model_len`` (HTTP 400, "max_tokens=8192 cannot be greater than max_model_len=1024"). No
retry changes that answer, so a ``judge.max_tokens`` or ``simulator.max_tokens`` that leaves no
room for the group's prompt is a configuration error: found here before a run starts, not in
every request of it.

``GET /v1/models`` reports each served model's ``max_model_len``. The prompt's floor is what the
group's template says before anything of the rollout is put in it, counted by the server's own
tokenizer and chat template (vLLM's ``POST /tokenize``); a server without that endpoint is
checked against ``max_tokens`` alone.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any

from slca_exp.core.problems import Problem

TOKENIZE_TIMEOUT_S = 5.0
"""How long one ``POST /tokenize`` may take."""


def count_prompt_tokens(
    base_url: str,
    model: str,
    text: str,
    api_key_env: str | None = None,
    timeout_s: float = TOKENIZE_TIMEOUT_S,
) -> int | None:
    """Tokens of ``text`` as one user message, as the server at ``base_url`` counts them.

    vLLM's ``POST /tokenize`` (beside ``/v1``) applies the served model's chat template. ``None``
    when the server has no such endpoint or does not answer with a count.
    """
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": text}]}).encode()
    headers = {"Content-Type": "application/json"}
    key = os.environ.get(api_key_env) if api_key_env else None
    if key:
        headers["Authorization"] = f"Bearer {key}"
    url = base_url.rstrip("/").removesuffix("/v1") + "/tokenize"
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:  # noqa: S310 - http(s)
            count = json.loads(answer.read()).get("count")
    except (urllib.error.URLError, OSError, ValueError, AttributeError):
        return None
    return int(count) if isinstance(count, int) and count >= 0 else None


def length_problems(
    group: str,
    max_tokens: int,
    card: dict[str, Any] | None,
    base_url: str,
    prompt_tokens: int | None = None,
) -> list[Problem]:
    """Whether ``<group>.max_tokens`` and the prompt's floor fit the served ``max_model_len``.

    Args:
        group: ``judge`` or ``simulator``.
        max_tokens: ``<group>.max_tokens``.
        card: the served model's entry of ``GET /v1/models`` (``None``: not served there).
        base_url: where it is served (named in the problem).
        prompt_tokens: the group's prompt before any rollout text, in the server's tokens
            (``None``: unknown; at least one token is assumed).

    """
    limit = (card or {}).get("max_model_len")
    if not isinstance(limit, int) or limit <= 0:
        return []
    floor = max(prompt_tokens or 0, 1)
    if max_tokens + floor <= limit:
        return []
    prompt = (
        f" and the {group}'s prompt is {prompt_tokens} tokens before any rollout text"
        if prompt_tokens
        else ""
    )
    room = limit - floor
    fix = (
        f"set {group}.max_tokens={room // 2} or lower (the rest is left for the rollout's "
        f"text), or serve the model with a longer --max-model-len"
        if room > 1
        else f"serve the model with a longer --max-model-len than {limit}"
    )
    return [
        Problem(
            f"{group}.max_tokens",
            f"{group}.max_tokens={max_tokens} does not fit the max_model_len {limit} of "
            f"{card.get('id', 'the model') if card else 'the model'} at {base_url}{prompt}: "
            "the server refuses every such request (HTTP 400), and no retry changes that",
            fix,
        )
    ]
