"""An async client for OpenAI-compatible chat completions (vLLM, SGLang, most gateways).

``POST {base_url}/chat/completions`` with ``{model, messages, temperature, max_tokens}``. What it
adds over a bare HTTP call:

- one connection pool (keep-alive) and at most ``concurrency`` requests in flight;
- a total deadline per attempt (``timeout_s``), then bounded retries (``max_retries``) with linear
  or exponential backoff on 5xx, 429, timeouts and transport errors; any other 4xx and a malformed
  200 body are not retried (asking again would get the same answer);
- failures come back as values (:class:`Completion` with ``error`` set), never as exceptions, so
  one bad request cannot take a batch down. The only exception is a missing API key, which is a
  configuration error and is raised before any request is sent;
- the API key is read from the environment variable NAMED by ``api_key_env`` at call time, sent as
  ``Authorization: Bearer ...`` and scrubbed from every string the client produces.

All requests run on an event loop the client owns, in a daemon thread. That makes the synchronous
entry point work whether or not the calling thread already runs a loop, and lets one pool and one
semaphore serve callers on any loop.

Transport: aiohttp. httpx 0.28 (httpcore 1.0) managed about 300 requests/s against a zero-latency
loopback server on a 2-core machine, because its pool re-checks every connection on each request;
aiohttp does about 7,500, so the client is never what limits a judge step.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp

from slca_exp.services.failures import FAILURES

log = logging.getLogger(__name__)

T = TypeVar("T")

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504}) | frozenset(range(505, 600))


class ServiceError(Exception):
    """A service cannot be used as configured; the message names the config key and the fix."""


class MissingAPIKeyError(ServiceError):
    """``api_key_env`` names an environment variable that is not set."""


@dataclass(frozen=True)
class ChatRequest:
    """One chat-completions request (the model comes from the client).

    Attributes:
        messages: OpenAI-style messages, ``{"role": ..., "content": ...}``.
        temperature: sampling temperature.
        max_tokens: completion budget.

    """

    messages: tuple[dict[str, str], ...]
    temperature: float = 0.0
    max_tokens: int = 1024


@dataclass(frozen=True)
class Completion:
    """The outcome of one request after retries.

    Attributes:
        content: the assistant message content; ``None`` on failure.
        error: why it failed (empty on success); never contains the API key.
        attempts: HTTP attempts made.
        latency_ms: wall time from the first attempt to the outcome, backoff included.

    """

    content: str | None
    error: str = ""
    attempts: int = 0
    latency_ms: float = 0.0

    @property
    def ok(self) -> bool:
        """Whether the request produced content."""
        return self.content is not None


class LoopThread:
    """An asyncio event loop running forever in a daemon thread."""

    def __init__(self, name: str = "slca-exp-services") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the loop; the returned future is thread-safe."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and block until it returns."""
        return self.submit(coro).result()

    async def arun(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and await it from another loop."""
        return await asyncio.wrap_future(self.submit(coro))

    def stop(self) -> None:
        """Stop the loop and join the thread (idempotent)."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.loop.close()


class ChatClient:
    """Chat completions against one OpenAI-compatible server.

    Args:
        base_url: e.g. ``http://127.0.0.1:8000/v1`` (``/chat/completions`` is appended).
        model: the served model name.
        api_key_env: NAME of the env var holding the API key; ``None``: send no key.
        timeout_s: deadline of one attempt (connect, send, wait, read).
        max_retries: extra attempts after the first on retryable failures.
        backoff: ``linear`` (retry k waits k * backoff_s) or ``exponential`` (2^(k-1) * backoff_s).
        backoff_s: base delay in seconds.
        concurrency: requests in flight at once (also the connection-pool size).
        config_key: the config group, used in error messages (``judge``, ``simulator``).
        locate: where the server is now (its base URL), asked again after a request found
            nobody answering: a service restarted by ``slca-exp serve up`` may answer elsewhere.

    """

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key_env: str | None = None,
        timeout_s: float = 60.0,
        max_retries: int = 3,
        backoff: str = "linear",
        backoff_s: float = 1.0,
        concurrency: int = 8,
        config_key: str = "service",
        locate: Callable[[], str | None] | None = None,
    ) -> None:
        if backoff not in ("linear", "exponential"):
            raise ServiceError(
                f"{config_key}.backoff={backoff!r} is not known; use linear or exponential"
            )
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.api_key_env = api_key_env
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.backoff = backoff
        self.backoff_s = float(backoff_s)
        self.concurrency = int(concurrency)
        self.config_key = config_key
        self.locate = locate
        self._loop: LoopThread | None = None
        self._http: aiohttp.ClientSession | None = None
        self._sem: asyncio.Semaphore | None = None
        self._guard = threading.Lock()

    @classmethod
    def from_config(cls, cfg: Any, config_key: str) -> ChatClient:  # noqa: ANN401
        """Build from a service config (``judge`` or ``simulator`` group)."""
        locate = None
        if getattr(cfg, "service", None):
            from slca_exp.services.served import current_base_url

            locate = functools.partial(current_base_url, cfg.service_registry, cfg.service)
        return cls(
            base_url=cfg.base_url,
            model=cfg.model,
            api_key_env=cfg.api_key_env,
            timeout_s=cfg.timeout_s,
            max_retries=cfg.max_retries,
            backoff=cfg.backoff,
            backoff_s=cfg.backoff_s,
            concurrency=cfg.concurrency,
            config_key=config_key,
            locate=locate,
        )

    def __repr__(self) -> str:
        # Only the variable's name: the key itself is never stored on the client.
        return (
            f"ChatClient(url={self.url!r}, model={self.model!r}, "
            f"api_key_env={self.api_key_env!r}, concurrency={self.concurrency})"
        )

    def api_key(self) -> str | None:
        """The API key from the environment, read now.

        Raises:
            MissingAPIKeyError: ``api_key_env`` is set but the variable is not (or is empty).

        """
        if not self.api_key_env:
            return None
        key = os.environ.get(self.api_key_env)
        if not key:
            raise MissingAPIKeyError(
                f"{self.config_key}.api_key_env names the environment variable "
                f"{self.api_key_env}, which is not set: export {self.api_key_env}=<your key>, "
                f"or set {self.config_key}.api_key_env=null for a server that needs no key"
            )
        return key

    def complete_many(self, requests: Sequence[ChatRequest]) -> list[Completion]:
        """Run ``requests`` concurrently and return their outcomes in order (blocking).

        Raises:
            MissingAPIKeyError: see :meth:`api_key`.

        """
        key = self.api_key()
        if not requests:
            return []
        return self._thread().run(self._run_many(requests, key))

    async def acomplete_many(self, requests: Sequence[ChatRequest]) -> list[Completion]:
        """Async :meth:`complete_many`, awaitable from any event loop."""
        key = self.api_key()
        if not requests:
            return []
        return await self._thread().arun(self._run_many(requests, key))

    def close(self) -> None:
        """Close the connection pool and stop the loop thread (idempotent)."""
        with self._guard:
            loop, self._loop = self._loop, None
        if loop is None:
            return
        if self._http is not None:
            with_http, self._http = self._http, None
            # RuntimeError: the loop is already gone (interpreter shutdown).
            with contextlib.suppress(RuntimeError):
                loop.run(with_http.close())
        loop.stop()

    def __enter__(self) -> ChatClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals (run on the owned loop) ------------------------------------------------

    def _thread(self) -> LoopThread:
        with self._guard:
            if self._loop is None:
                self._loop = LoopThread()
            return self._loop

    async def _run_many(self, requests: Sequence[ChatRequest], key: str | None) -> list[Completion]:
        if self._http is None:
            # One pool for the client's life: keep-alive connections, at most `concurrency` of
            # them; the semaphore below keeps requests beyond that queued in our code, not in
            # the pool, so the backoff sleeps never hold a connection.
            connector = aiohttp.TCPConnector(limit=self.concurrency, limit_per_host=0)
            self._http = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                skip_auto_headers=("User-Agent",),
                headers={"User-Agent": "slca-exp"},
            )
            self._sem = asyncio.Semaphore(self.concurrency)
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        coros = [self._one(request, headers, key) for request in requests]
        return list(await asyncio.gather(*coros))

    def _delay(self, retry: int) -> float:
        if self.backoff == "exponential":
            return self.backoff_s * 2 ** (retry - 1)
        return self.backoff_s * retry

    async def _one(
        self, request: ChatRequest, headers: dict[str, str], key: str | None
    ) -> Completion:
        body = json.dumps(
            {
                "model": self.model,
                "messages": list(request.messages),
                "temperature": request.temperature,
                "max_tokens": request.max_tokens,
            },
            ensure_ascii=False,
        ).encode("utf-8", "surrogatepass")
        start = time.perf_counter()
        attempt, reason = 0, ""
        while True:
            attempt += 1
            content, reason, retry = await self._attempt(body, headers)
            if content is not None:
                # A server that echoes its headers must not smuggle the key into results/cache.
                return Completion(scrub(content, key), "", attempt, _ms(start))
            if retry:
                self._relocate()
            if not retry or attempt > self.max_retries:
                break
            await asyncio.sleep(self._delay(attempt))
        tail = f" after {attempt} attempts" if attempt > 1 else ""
        error = scrub(f"{reason}{tail}", key)
        FAILURES.note(self.config_key, error)  # said once per kind and step, not per request
        return Completion(None, error, attempt, _ms(start))

    def _relocate(self) -> None:
        """Follow the server to where :attr:`locate` says it is now (a quick file read)."""
        if self.locate is None:
            return
        try:
            base = self.locate()
        except (OSError, ValueError) as err:
            log.warning("%s: could not look up the service's endpoint: %s", self.config_key, err)
            return
        url = base.rstrip("/") + "/chat/completions" if base else None
        if url and url != self.url:
            log.warning("%s: the service now answers at %s", self.config_key, base)
            self.url = url

    async def _attempt(self, body: bytes, headers: dict[str, str]) -> tuple[str | None, str, bool]:
        """One HTTP attempt: ``(content, reason, retryable)``."""
        assert self._http is not None and self._sem is not None
        async with self._sem:
            try:
                # ClientTimeout(total=timeout_s) bounds connect, send, wait and read together.
                async with self._http.post(self.url, data=body, headers=headers) as response:
                    status = response.status
                    raw = await response.read()
            except asyncio.TimeoutError:
                return None, f"timeout after {self.timeout_s:g} s", True
            except aiohttp.ClientError as exc:
                return None, f"transport error ({type(exc).__name__}: {exc})", True
        if status != 200:
            text = raw[:200].decode("utf-8", "replace").replace("\n", " ")
            return None, f"HTTP {status}: {text}", status in RETRY_STATUSES
        return (*_content_of(raw), False)


def _content_of(raw: bytes) -> tuple[str | None, str]:
    try:
        doc = json.loads(raw)
    except ValueError:
        return None, f"garbage response: not JSON ({raw[:80]!r})"
    try:
        content = doc["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        return None, "garbage response: JSON without choices[0].message.content"
    if not isinstance(content, str):
        return None, "garbage response: message content is not a string"
    return content, ""


def scrub(text: str, key: str | None) -> str:
    """``text`` with every occurrence of ``key`` replaced by ``***``.

    >>> scrub("Bearer sk-123 failed", "sk-123")
    'Bearer *** failed'

    """
    return text.replace(key, "***") if key else text


def _ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000.0
