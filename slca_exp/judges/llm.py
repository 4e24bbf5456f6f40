"""The LLM judge (registry name ``openai``): the paper's frozen judge over an OpenAI-compatible API.

Any server speaking chat completions works (``vllm serve openai/gpt-oss-120b``, SGLang, a
gateway). The judge sees what the request's view shows (``reward.judge_view``: the question, the
numbered ``<tool_response>`` contents and the final reply; or, under ``interaction``, every tool
call and response as the public v8.2 reward listed them), rendered into a versioned template
(``judge.prompt``, or the reward's ``reward.judge_prompt``; sha256 recorded), and must answer
``<response_quality><reasoning>..</reasoning><rating>LABEL</rating></response_quality>`` with a
label from very poor to excellent (1-5). The paper's short-circuits apply first; answers come
from the persistent cache when the same request was rated before; transport failures are
retried by the client and, when retries run out, come back as ``status="failed"``, score NaN.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from slca_exp.judges.base import (
    LABELS,
    VIEW_FIELDS,
    JudgeBase,
    JudgeRequest,
    JudgeResult,
    JudgeView,
    short_circuit_fields,
)
from slca_exp.rewards.toolcalls import strip_think
from slca_exp.services.cache import open_cache
from slca_exp.services.cached import Answer, CachedChat, served_fields, user_request
from slca_exp.services.client import ChatClient, ChatRequest
from slca_exp.services.failures import FAILURES
from slca_exp.services.prompts import PromptTemplate

DEFAULT_PROMPT = "hierr_judge_v1.txt"
UNPARSEABLE = "its reply holds no rating the judge's parser reads"
"""How a judged reply without a rating counts among the step's failures."""
"""The shipped template used when ``judge.prompt`` is not set."""

_RATINGS = {label: i + 1 for i, label in enumerate(LABELS)} | {str(i): i for i in range(1, 6)}


def parse_rating(content: str) -> int | None:
    """The rating (1-5) in a judge's answer, or ``None`` when there is none.

    The last ``<rating>..</rating>`` block counts (tags case-insensitive, whitespace inside
    collapsed, a trailing period ignored); it may hold a label or a digit 1-5. Without such a
    block, an answer that is a bare digit 1-5 is accepted. Think blocks are removed first.

    >>> parse_rating("<response_quality><reasoning>ok</reasoning><rating> Very  Poor </rating>")
    1
    >>> parse_rating("4"), parse_rating("<rating>great</rating>"), parse_rating("about 4")
    (4, None, None)

    """
    text = strip_think(content)
    low = text.lower()
    start = low.rfind("<rating>")
    if start >= 0:
        stop = low.find("</rating>", start)
        if stop >= 0:
            inner = " ".join(low[start + len("<rating>") : stop].split()).rstrip(".")
            return _RATINGS.get(inner)
    bare = text.strip().rstrip(".")
    return int(bare) if len(bare) == 1 and bare in "12345" else None


def render_tool_responses(responses: Sequence[str]) -> str:
    """The numbered tool responses as the template shows them (``[1] ...``)."""
    if not responses:
        return "(no tool responses)"
    return "\n\n".join(f"[{i}] {content}" for i, content in enumerate(responses, 1))


def _usable(content: str) -> bool:
    return parse_rating(content) is not None


class OpenAIJudge(JudgeBase):
    """The LLM judge over an OpenAI-compatible server.

    Args:
        cfg: the ``judge`` config (``JudgeConfig``): model, base_url, api_key_env, prompt,
            temperature, max_tokens, timeout_s, max_retries, backoff, backoff_s, concurrency,
            cache, cache_path and the short-circuit switches.

    """

    name = "openai"
    remote = True
    views = ("responses", "interaction")

    def __init__(self, cfg: Any) -> None:  # noqa: ANN401
        super().__init__(cfg)
        self.template = PromptTemplate.load(cfg.prompt or DEFAULT_PROMPT, "judge")
        self.chat = CachedChat(
            ChatClient.from_config(cfg, "judge"),
            open_cache(cfg.cache, cfg.cache_path),
            kind="judge",
            prompt_sha256=self.template.sha256,
        )
        # A reward's own template (reward.judge_prompt) -> it and its chat: the same client and
        # cache, keyed by that template's sha256.
        self._templates: dict[str, tuple[PromptTemplate, CachedChat]] = {}

    def score(self, batch: Sequence[JudgeRequest]) -> list[JudgeResult]:
        """Rate a batch, blocking; failures come back as ``status="failed"``, never raised.

        Raises:
            MissingAPIKeyError: ``judge.api_key_env`` names an unset variable (nothing is sent).
            FileNotFoundError: a request's ``prompt`` names no template (validation refuses it
                before a run starts).

        """
        results, pending = self._prepare(batch)
        found: dict[int, Answer] = {}
        for chat, slots in self._by_chat(batch, pending).items():
            done = chat.complete([pending[k][1] for k in slots], _usable)
            found.update(zip(slots, done, strict=True))
        return self._finish(results, pending, [found[k] for k in range(len(pending))])

    async def ascore(self, batch: Sequence[JudgeRequest]) -> list[JudgeResult]:
        """Async :meth:`score`, awaitable from any event loop."""
        results, pending = self._prepare(batch)
        found: dict[int, Answer] = {}
        for chat, slots in self._by_chat(batch, pending).items():
            done = await chat.acomplete([pending[k][1] for k in slots], _usable)
            found.update(zip(slots, done, strict=True))
        return self._finish(results, pending, [found[k] for k in range(len(pending))])

    def request_for(self, view: JudgeView, prompt: str | None = None) -> ChatRequest:
        """The chat request rating one rollout (one user message: the rendered template).

        Args:
            view: what the judge is shown.
            prompt: the reward's template (``JudgeRequest.prompt``); ``None``: the judge's.

        """
        fields = VIEW_FIELDS[view.kind]
        values = {
            "question": view.question,
            "tool_responses": render_tool_responses(view.tool_responses),
            "tool_interactions": view.tool_interactions,
            "reply": view.reply,
        }
        template = self._template(prompt)[0]
        return user_request(template.render(**{k: values[k] for k in fields}), self.cfg)

    @classmethod
    def template_fields(cls, cfg: Any, prompt: str | None = None) -> tuple[str, ...] | None:  # noqa: ANN401
        """The ``{{...}}`` fields of ``prompt`` (the reward's template), else the judge's own."""
        return PromptTemplate.load(prompt or cfg.prompt or DEFAULT_PROMPT, "judge").fields

    @classmethod
    def describe_config(cls, cfg: Any) -> dict[str, Any]:  # noqa: ANN401
        """Backend, model, prompt version and sha256, decoding and short-circuit settings."""
        template = PromptTemplate.load(cfg.prompt or DEFAULT_PROMPT, "judge")
        return served_fields("openai", cfg, template) | short_circuit_fields(cfg)

    @classmethod
    def prompt_text(cls, cfg: Any) -> str:  # noqa: ANN401
        """The template file's text."""
        return PromptTemplate.load(cfg.prompt or DEFAULT_PROMPT, "judge").text

    def close(self) -> None:
        """Close the HTTP client and the cache (idempotent; the reward's chats share them)."""
        self.chat.close()

    def _template(self, prompt: str | None) -> tuple[PromptTemplate, CachedChat]:
        """The template ``prompt`` names and the chat keyed by its sha256 (the judge's: None)."""
        if not prompt:
            return self.template, self.chat
        if prompt not in self._templates:
            template = PromptTemplate.load(prompt, "judge")
            chat = self.chat
            if template.sha256 != self.template.sha256:
                chat = CachedChat(
                    self.chat.client, self.chat.cache, kind="judge", prompt_sha256=template.sha256
                )
            self._templates[prompt] = (template, chat)
        return self._templates[prompt]

    def _by_chat(
        self, batch: Sequence[JudgeRequest], pending: list[tuple[int, ChatRequest]]
    ) -> dict[CachedChat, list[int]]:
        """The pending requests (their positions in ``pending``) per chat their template uses."""
        groups: dict[CachedChat, list[int]] = {}
        for k, (i, _) in enumerate(pending):
            groups.setdefault(self._template(batch[i].prompt)[1], []).append(k)
        return groups

    def _prepare(
        self, batch: Sequence[JudgeRequest]
    ) -> tuple[list[JudgeResult | None], list[tuple[int, ChatRequest]]]:
        results: list[JudgeResult | None] = []
        pending: list[tuple[int, ChatRequest]] = []
        for i, request in enumerate(batch):
            view = JudgeView.of(request)
            verdict = self._short_circuit(view, request)
            results.append(verdict)
            if verdict is None:
                pending.append((i, self.request_for(view, request.prompt)))
        return results, pending

    def _finish(
        self,
        results: list[JudgeResult | None],
        pending: list[tuple[int, ChatRequest]],
        answers: Sequence[Answer],
    ) -> list[JudgeResult]:
        for (i, _), answer in zip(pending, answers, strict=True):
            results[i] = _verdict(answer)
        return self._count([r for r in results if r is not None])


def _verdict(answer: Answer) -> JudgeResult:
    if answer.content is None:
        return JudgeResult.failed(answer.error, latency_ms=answer.latency_ms)
    rating = parse_rating(answer.content)
    if rating is None:
        snippet = " ".join(answer.content.split())[:80]
        reason = f"unparseable rating: {snippet!r}"
        FAILURES.note("judge", reason, kind=UNPARSEABLE)  # said once per step, not per reply
        return JudgeResult.failed(reason, latency_ms=answer.latency_ms)
    return JudgeResult.rated(rating, cached=answer.cached, latency_ms=answer.latency_ms)
