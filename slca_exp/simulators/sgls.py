"""SGLS, the Schema-Guided LLM Simulator (registry name ``sgls``; the paper's simulator).

For each call: the arguments are checked against the tool's schema first (``simulators.schema``)
and a violation comes back at once as a ``schema_error`` tool response, without a request. A
conforming call is rendered into a versioned "you are an API server" template (``simulator.prompt``,
sha256 recorded) with the tool's schema, the call, the row's question and up to two recorded
responses of the same tool as format examples, and sent to an OpenAI-compatible server (the
paper: Qwen3-235B-A22B-Instruct-2507 at temperature 0.6). Answers go through the persistent cache
(so a re-run sees the same simulated world); a service failure after retries gives
``status="failed"`` and the content ``{"error": "tool unavailable"}``.

``simulator.schema_guidance=false`` is SGLS without its schema guidance (the w/o-SGLS ablation):
no call's arguments are checked, and the default template (``sgls_no_schema_v1.txt``) shows the
model only the tool's name and arguments, so it must guess the response's shape.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from slca_exp.rewards.toolcalls import strip_think
from slca_exp.services.cache import canonical_json, open_cache
from slca_exp.services.cached import Answer, CachedChat, served_fields, user_request
from slca_exp.services.client import ChatClient, ChatRequest
from slca_exp.services.prompts import PromptTemplate
from slca_exp.simulators.base import (
    UNAVAILABLE,
    SimRequest,
    SimulatorBase,
    ToolResponse,
    argument_checks,
    check_fields,
    guided,
)
from slca_exp.simulators.schema import check_call, error_content

DEFAULT_PROMPT = "sgls_v1.txt"
"""The shipped template used when ``simulator.prompt`` is not set."""
UNGUIDED_PROMPT = "sgls_no_schema_v1.txt"
"""The same without the tool's schema: the default when ``simulator.schema_guidance=false``."""

MAX_EXAMPLES = 2
MAX_EXAMPLE_CHARS = 2000


def clean_content(content: str) -> str:
    r"""The tool response in a model's answer: think blocks and a Markdown code fence removed.

    >>> clean_content('<think>plan</think>```json\n{"ok": true}\n```')
    '{"ok": true}'

    """
    text = strip_think(content).strip()
    if text.startswith("```"):
        first_newline = text.find("\n")
        text = text[first_newline + 1 :] if first_newline >= 0 else ""
        if text.rstrip().endswith("```"):
            text = text.rstrip()[:-3]
    return text.strip()


def _usable(content: str) -> bool:
    return bool(clean_content(content))


class SGLSSimulator(SimulatorBase):
    """The schema-guided LLM simulator over an OpenAI-compatible server.

    Args:
        cfg: the ``simulator`` config (``SimulatorConfig``): model, base_url, api_key_env,
            prompt, temperature, max_tokens, timeout_s, max_retries, backoff, backoff_s,
            concurrency, cache, cache_path, check_required_args, check_types.

    """

    name = "sgls"
    remote = True

    def __init__(self, cfg: Any) -> None:  # noqa: ANN401
        super().__init__(cfg)
        self.template = template_of(cfg)
        self.chat = CachedChat(
            ChatClient.from_config(cfg, "simulator"),
            open_cache(cfg.cache, cfg.cache_path),
            kind="simulator",
            prompt_sha256=self.template.sha256,
        )

    def respond_batch(self, requests: Sequence[SimRequest]) -> list[ToolResponse]:
        """Simulate a batch, blocking; failures come back as responses, never raised.

        Raises:
            MissingAPIKeyError: ``simulator.api_key_env`` names an unset variable.

        """
        results, pending = self._prepare(requests)
        answers = self.chat.complete([r for _, r in pending], _usable) if pending else []
        return self._finish(results, pending, answers)

    async def arespond_batch(self, requests: Sequence[SimRequest]) -> list[ToolResponse]:
        """Async :meth:`respond_batch`, awaitable from any event loop."""
        results, pending = self._prepare(requests)
        answers = await self.chat.acomplete([r for _, r in pending], _usable) if pending else []
        return self._finish(results, pending, answers)

    def request_for(self, request: SimRequest) -> ChatRequest:
        """The chat request simulating one (schema-conforming) call."""
        call = request.call
        examples = [
            item.get("content")
            for item in request.context.recorded
            if isinstance(item, dict) and item.get("name") == call.name
        ][:MAX_EXAMPLES]
        shown = [
            (e if isinstance(e, str) else canonical_json(e))[:MAX_EXAMPLE_CHARS] for e in examples
        ]
        values = {
            "question": request.context.question or "(not given)",
            "examples": "\n\n".join(shown) or "(none)",
            "call": canonical_json({"name": call.name, "arguments": call.arguments}),
        }
        if guided(self.cfg):
            values["schema"] = json.dumps(request.schema, ensure_ascii=False, indent=2, default=str)
        prompt = self.template.render(**values)
        return user_request(prompt, self.cfg)

    @classmethod
    def describe_config(cls, cfg: Any) -> dict[str, Any]:  # noqa: ANN401
        """Backend, model, prompt version and sha256, decoding and schema-check settings."""
        return served_fields("sgls", cfg, template_of(cfg)) | check_fields(cfg)

    @classmethod
    def prompt_text(cls, cfg: Any) -> str:  # noqa: ANN401
        """The template file's text."""
        return template_of(cfg).text

    def close(self) -> None:
        """Close the HTTP client and the cache (idempotent)."""
        self.chat.close()

    def _prepare(
        self, requests: Sequence[SimRequest]
    ) -> tuple[list[ToolResponse | None], list[tuple[int, ChatRequest]]]:
        results: list[ToolResponse | None] = []
        pending: list[tuple[int, ChatRequest]] = []
        for i, request in enumerate(requests):
            errors = check_call(request.call, request.schema, **argument_checks(self.cfg))
            if errors:
                content = error_content(request.call, errors)
                results.append(ToolResponse(content, "schema_error", "; ".join(errors)))
                continue
            results.append(None)
            try:
                pending.append((i, self.request_for(request)))
            except (TypeError, ValueError, RecursionError) as exc:
                # Arguments no JSON encoder can write (circular, absurdly deep): not askable.
                results[i] = ToolResponse(UNAVAILABLE, "failed", f"unencodable call: {exc}"[:200])
        return results, pending

    def _finish(
        self,
        results: list[ToolResponse | None],
        pending: list[tuple[int, ChatRequest]],
        answers: Sequence[Answer],
    ) -> list[ToolResponse]:
        for (i, _), answer in zip(pending, answers, strict=True):
            results[i] = _response(answer)
        return self._count([r for r in results if r is not None])


def template_of(cfg: Any) -> PromptTemplate:  # noqa: ANN401
    """The template ``simulator.prompt`` names, else the default for ``schema_guidance``.

    Raises:
        FileNotFoundError: ``simulator.prompt`` names no template.

    """
    default = DEFAULT_PROMPT if guided(cfg) else UNGUIDED_PROMPT
    return PromptTemplate.load(cfg.prompt or default, "simulator")


def _response(answer: Answer) -> ToolResponse:
    if answer.content is None:
        return ToolResponse(UNAVAILABLE, "failed", answer.error, latency_ms=answer.latency_ms)
    content = clean_content(answer.content)
    if not content:
        return ToolResponse(UNAVAILABLE, "failed", "empty response", latency_ms=answer.latency_ms)
    return ToolResponse(content, "ok", "", answer.cached, answer.latency_ms)
