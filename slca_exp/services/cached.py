"""Chat completions through the persistent cache: what the judges and SGLS share.

A batch is looked up in the cache in one query; the misses, deduplicated (GRPO groups often hold
identical rollouts), go to the server concurrently; the answers the caller can use are stored in
one transaction. Unusable answers and failures are never stored.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from slca_exp.services.cache import ServiceCache, canonical_json
from slca_exp.services.client import ChatClient, ChatRequest, Completion
from slca_exp.services.prompts import PromptTemplate


def user_request(prompt: str, cfg: Any) -> ChatRequest:  # noqa: ANN401 - a ServiceConfig
    """One chat request holding ``prompt`` as its single user message, decoded as ``cfg`` says."""
    return ChatRequest(
        ({"role": "user", "content": prompt},), float(cfg.temperature), int(cfg.max_tokens)
    )


def served_fields(backend: str, cfg: Any, template: PromptTemplate) -> dict[str, Any]:  # noqa: ANN401
    """The recipe fields of a served model: backend, model, prompt version and sha256, decoding.

    The endpoint (``base_url``) is left out on purpose: the same weights served elsewhere are the
    same component.
    """
    return {
        "backend": backend,
        "name": cfg.name,
        "model": cfg.model,
        "prompt": template.path.name,
        "prompt_version": cfg.prompt_version or template.path.stem,
        "prompt_sha256": template.sha256,
        "temperature": float(cfg.temperature),
        "max_tokens": int(cfg.max_tokens),
    }


@dataclass(frozen=True)
class Answer:
    """The outcome of one request.

    Attributes:
        content: the assistant content, or ``None`` when the request failed.
        error: why it failed (empty otherwise).
        cached: it came from the cache.
        latency_ms: time spent on the server (0 for cache hits).

    """

    content: str | None
    error: str = ""
    cached: bool = False
    latency_ms: float = 0.0


class CachedChat:
    """A :class:`ChatClient` behind a :class:`ServiceCache`.

    Args:
        client: the HTTP client.
        cache: the cache, or ``None`` for none.
        kind: what the answers are (``judge``, ``simulator``): part of every key.
        prompt_sha256: the template's hash: part of every key.

    """

    def __init__(
        self, client: ChatClient, cache: ServiceCache | None, *, kind: str, prompt_sha256: str
    ) -> None:
        self.client = client
        self.cache = cache
        self.kind = kind
        self.prompt_sha256 = prompt_sha256

    def key(self, request: ChatRequest) -> str:
        """The cache key: everything that determines the answer (not the server's address).

        sha256 over the canonical JSON of the settings (kind, model, prompt sha256, temperature,
        max_tokens, message roles), then each message content, UTF-8, length-prefixed. Hashing
        the contents directly instead of JSON-escaping them first keeps cache hits cheap.
        """
        head = {
            "kind": self.kind,
            "model": self.client.model,
            "prompt_sha256": self.prompt_sha256,
            "temperature": float(request.temperature),
            "max_tokens": int(request.max_tokens),
            "roles": [m.get("role", "") for m in request.messages],
        }
        h = hashlib.sha256(canonical_json(head).encode())
        for message in request.messages:
            data = str(message.get("content", "")).encode("utf-8", "surrogatepass")
            h.update(len(data).to_bytes(8, "big"))
            h.update(data)
        return h.hexdigest()

    def complete(
        self, requests: Sequence[ChatRequest], usable: Callable[[str], bool]
    ) -> list[Answer]:
        """Answer ``requests`` (blocking); ``usable(content)`` decides what may be cached."""
        keys, answers, todo = self._lookup(requests, usable)
        if todo:
            done = self.client.complete_many([requests[i] for i in todo.values()])
            self._store(todo, done, answers, usable)
        return [answers[k] for k in keys]

    async def acomplete(
        self, requests: Sequence[ChatRequest], usable: Callable[[str], bool]
    ) -> list[Answer]:
        """Async :meth:`complete`."""
        keys, answers, todo = self._lookup(requests, usable)
        if todo:
            done = await self.client.acomplete_many([requests[i] for i in todo.values()])
            self._store(todo, done, answers, usable)
        return [answers[k] for k in keys]

    def close(self) -> None:
        """Close the client and the cache (idempotent)."""
        self.client.close()
        if self.cache is not None:
            self.cache.close()

    def _lookup(
        self, requests: Sequence[ChatRequest], usable: Callable[[str], bool]
    ) -> tuple[list[str], dict[str, Answer], dict[str, int]]:
        keys = [self.key(r) for r in requests]
        hits = self.cache.get_many(keys) if self.cache is not None else {}
        answers: dict[str, Answer] = {}
        todo: dict[str, int] = {}  # key -> index of its first request
        for i, key in enumerate(keys):
            if key in answers or key in todo:
                continue
            content = hits.get(key, {}).get("content") if isinstance(hits.get(key), dict) else None
            if isinstance(content, str) and usable(content):
                answers[key] = Answer(content, cached=True)
            else:
                todo[key] = i
        return keys, answers, todo

    def _store(
        self,
        todo: dict[str, int],
        done: list[Completion],
        answers: dict[str, Answer],
        usable: Callable[[str], bool],
    ) -> None:
        fresh = {}
        for key, completion in zip(todo, done, strict=True):
            content, error, ms = completion.content, completion.error, completion.latency_ms
            answers[key] = Answer(content, error, False, ms)
            if content is not None and usable(content):
                fresh[key] = {"content": content}
        if fresh and self.cache is not None:
            self.cache.put_many(fresh)
