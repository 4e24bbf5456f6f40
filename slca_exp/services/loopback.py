"""A real OpenAI-compatible HTTP server on 127.0.0.1 for tests, benchmarks and offline smoke runs.

It answers ``POST .../chat/completions`` with a chat-completion JSON and can be told, for the
whole server (:class:`Behaviour`) or per request, to misbehave the way real servers do: answer
after a fixed latency, fail with HTTP 500 (or any status) N times before answering, hang past the
client's timeout, or return garbage (a non-JSON body, or JSON without ``choices``).

Per-request control, two ways:

- ``route``: a function of the :class:`RecordedRequest` returning a :class:`Behaviour` (or
  ``None`` for the server's), for servers run in a thread;
- a directive anywhere in a message: ``[loopback:{"fail_first": 2, "content": "4"}]`` overrides
  those :class:`Behaviour` fields for that request. It works with the subprocess server too, and a
  judge or simulator carries it through from the question text.

``fail_first`` counts per distinct request body, so concurrent requests each fail N times and a
retry of the same request is recognised. Every request is recorded with its headers, and the
server tracks how many requests were in flight at once.

Run it in a background thread (:func:`serve_in_thread`) or in a subprocess
(:func:`serve_in_subprocess`, for benchmarks that must not share the client's GIL), or from the
command line: ``python -m slca_exp.services.loopback --behaviour '{"latency_s": 0.05}'``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from slca_exp.services.client import LoopThread

DEFAULT_CONTENT = (
    "<response_quality><reasoning>The reply reports the tool results faithfully."
    "</reasoning><rating>good</rating></response_quality>"
)
DIRECTIVE = "[loopback:"
_DIRECTIVE_BYTES = DIRECTIVE.encode()
GARBAGE = ("", "not_json", "no_choices")
_HANGUPS = (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError)
_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    429: "Too Many Requests",
}
DEFAULT_MODEL = "loopback"
"""The model id a server lists when it is given none."""
VERSION = "loopback-1"
"""What ``GET /version`` answers (vLLM answers its version there)."""


@dataclass
class Behaviour:
    """How the server answers.

    Attributes:
        content: the assistant message content.
        content_fn: computes the content from the request instead (thread servers only).
        fail_first: answer ``fail_status`` this many times per distinct request body first.
        fail_status: the status of those failures.
        status: answer every request with this status (e.g. 400) and an error JSON.
        hang_s: wait this long before answering (past the client's timeout).
        garbage: ``not_json`` (a non-JSON 200 body) or ``no_choices`` (JSON without choices).
        latency_s: fixed delay before every answer.

    """

    content: str = DEFAULT_CONTENT
    content_fn: Callable[[RecordedRequest], str] | None = None
    fail_first: int = 0
    fail_status: int = 500
    status: int = 200
    hang_s: float = 0.0
    garbage: str = ""
    latency_s: float = 0.0


@dataclass(frozen=True)
class RecordedRequest:
    """A request as the server received it (header names lower-cased)."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    received_at: float = field(default_factory=time.monotonic)

    def json(self) -> Any:  # noqa: ANN401
        """The decoded body, or ``None`` when it is not JSON."""
        try:
            return json.loads(self.body)
        except ValueError:
            return None

    @property
    def text(self) -> str:
        """The messages' contents joined by newlines ("" when the body has none)."""
        doc = self.json()
        messages = doc.get("messages") if isinstance(doc, dict) else None
        if not isinstance(messages, list):
            return ""
        return "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))


class LoopbackServer:
    """The server; start it on a running loop with :meth:`start`, or use the context managers.

    Args:
        behaviour: the server-wide :class:`Behaviour` (default: answer :data:`DEFAULT_CONTENT`).
        route: optional per-request behaviour, see the module docstring.
        host: must stay a loopback address.
        port: 0 picks a free port.
        models: the model ids ``GET /v1/models`` lists (as vLLM's server does), each with
            ``max_model_len``; ``GET /version`` answers :data:`VERSION`.
        max_model_len: the context length the model cards report.
        api_key: when set, every request must carry ``Authorization: Bearer <api_key>`` (else
            HTTP 401), as a vLLM server started with a key requires.

    """

    def __init__(
        self,
        behaviour: Behaviour | None = None,
        *,
        route: Callable[[RecordedRequest], Behaviour | None] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        models: tuple[str, ...] = (DEFAULT_MODEL,),
        max_model_len: int | None = None,
        api_key: str | None = None,
    ) -> None:
        self.behaviour = behaviour or Behaviour()
        self.models, self.max_model_len, self._api_key = tuple(models), max_model_len, api_key
        self.route = route
        self.host, self.port = host, port
        self.requests: list[RecordedRequest] = []
        self.max_in_flight = 0
        self._active: set[int] = set()  # ids of requests being answered since the last reset
        self._failed: dict[str, int] = {}
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1``."""
        return f"http://{self.host}:{self.port}/v1"

    def configure(self, **fields: Any) -> None:  # noqa: ANN401
        """Change server-wide :class:`Behaviour` fields."""
        self.behaviour = dataclasses.replace(self.behaviour, **fields)

    def reset(self) -> None:
        """Forget recorded requests, failure counts and the in-flight maximum."""
        self.requests.clear()
        self._failed.clear()
        self._active.clear()  # requests still hanging from before no longer count
        self.max_in_flight = 0

    @property
    def in_flight(self) -> int:
        """Requests being answered now (received since the last reset)."""
        return len(self._active)

    @property
    def completions(self) -> list[RecordedRequest]:
        """The recorded chat-completions requests."""
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    async def start(self) -> None:
        """Listen (on the running loop)."""
        self._server = await asyncio.start_server(
            self._serve, self.host, self.port, limit=1 << 20, backlog=512
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening and drop open connections (hanging requests included)."""
        if self._server is not None:
            self._server.close()
            for writer in list(self._writers):
                writer.close()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path = (lines[0].split(" ") + ["", ""])[:2]
                headers = {}
                for line in lines[1:]:
                    name, sep, value = line.partition(":")
                    if sep:
                        headers[name.strip().lower()] = value.strip()
                size = int(headers.get("content-length") or 0)
                body = await reader.readexactly(size) if size else b""
                status, payload = await self._answer(RecordedRequest(method, path, headers, body))
                reason = _REASONS.get(status, "Internal Server Error" if status >= 500 else "Error")
                writer.write(
                    f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(payload)}\r\n\r\n".encode("latin-1")
                    + payload
                )
                await writer.drain()
                if headers.get("connection", "").lower() == "close":
                    break
        except _HANGUPS:
            pass  # the client went away, or sent something that is not HTTP/1.1
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _answer(self, request: RecordedRequest) -> tuple[int, bytes]:
        if request.method == "GET" and request.path.endswith("/loopback/stats"):
            stats = {"requests": len(self.completions), "max_in_flight": self.max_in_flight}
            return 200, json.dumps(stats).encode()
        if self._api_key and request.headers.get("authorization") != f"Bearer {self._api_key}":
            return 401, b'{"error": {"message": "Unauthorized"}}'
        if request.method == "GET" and request.path.rstrip("/").endswith("/v1/models"):
            return 200, json.dumps(self.model_list()).encode()
        if request.method == "GET" and request.path.rstrip("/") == "/version":
            return 200, json.dumps({"version": VERSION}).encode()
        if not request.path.endswith("/chat/completions"):
            return 404, b'{"error": {"message": "not found"}}'
        self.requests.append(request)
        self._active.add(id(request))
        self.max_in_flight = max(self.max_in_flight, len(self._active))
        try:
            return await self._complete(request, self._behaviour_for(request))
        finally:
            self._active.discard(id(request))

    def model_list(self) -> dict[str, Any]:
        """What ``GET /v1/models`` answers: vLLM's model list, one card per model id."""
        cards = [
            {
                "id": model,
                "object": "model",
                "owned_by": "slca-exp-loopback",
                "root": model,
                "max_model_len": self.max_model_len,
            }
            for model in self.models
        ]
        return {"object": "list", "data": cards}

    def _behaviour_for(self, request: RecordedRequest) -> Behaviour:
        routed = self.route(request) if self.route is not None else None
        behaviour = routed or self.behaviour
        if _DIRECTIVE_BYTES not in request.body:  # cheap test before decoding the body
            return behaviour
        text = request.text
        at = text.find(DIRECTIVE)
        if at >= 0:
            try:
                fields, _ = json.JSONDecoder().raw_decode(text, at + len(DIRECTIVE))
                behaviour = dataclasses.replace(behaviour, **fields)
            except (ValueError, TypeError):
                pass  # a malformed directive is ordinary text
        return behaviour

    async def _complete(self, request: RecordedRequest, b: Behaviour) -> tuple[int, bytes]:
        if b.latency_s > 0:
            await asyncio.sleep(b.latency_s)
        digest = hashlib.sha256(request.body).hexdigest() if b.fail_first else ""
        if b.fail_first and self._failed.get(digest, 0) < b.fail_first:
            self._failed[digest] = self._failed.get(digest, 0) + 1
            return b.fail_status, b'{"error": {"message": "injected failure"}}'
        if b.hang_s > 0:
            await asyncio.sleep(b.hang_s)
        if b.status != 200:
            return b.status, b'{"error": {"message": "refused by the loopback server"}}'
        if b.garbage == "not_json":
            return 200, b"<html>502 upstream hiccup</html>"
        doc = request.json()
        model = doc.get("model", "") if isinstance(doc, dict) else ""
        if b.garbage == "no_choices":
            return 200, json.dumps({"id": "cmpl-loopback", "model": model}).encode()
        content = b.content_fn(request) if b.content_fn is not None else b.content
        answer = {
            "id": "cmpl-loopback",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }
        return 200, json.dumps(answer, ensure_ascii=False).encode("utf-8", "surrogatepass")


@contextmanager
def serve_in_thread(
    behaviour: Behaviour | None = None,
    *,
    route: Callable[[RecordedRequest], Behaviour | None] | None = None,
    models: tuple[str, ...] = (DEFAULT_MODEL,),
    max_model_len: int | None = None,
    api_key: str | None = None,
    **fields: Any,  # noqa: ANN401
) -> Iterator[LoopbackServer]:
    """Run a :class:`LoopbackServer` on an event loop in a daemon thread.

    Args:
        behaviour: the server-wide behaviour; ``fields`` override some of its fields.
        route: per-request behaviour.
        models: the model ids ``GET /v1/models`` lists.
        max_model_len: the context length the model cards report.
        api_key: the key every request must carry (``None``: none).
        **fields: :class:`Behaviour` fields, e.g. ``latency_s=0.05``.

    Yields:
        The running server (``server.base_url``, ``server.requests``, ``server.configure``).

    """
    server = LoopbackServer(
        dataclasses.replace(behaviour or Behaviour(), **fields),
        route=route,
        models=models,
        max_model_len=max_model_len,
        api_key=api_key,
    )
    thread = LoopThread("slca-exp-loopback")
    try:
        thread.run(server.start())
        yield server
    finally:
        thread.run(server.stop())
        thread.stop()


@dataclass(frozen=True)
class RemoteLoopback:
    """A loopback server running in another process."""

    base_url: str
    process: subprocess.Popen[str]

    def stats(self) -> dict[str, int]:
        """``{"requests": ..., "max_in_flight": ...}`` as the server counts them."""
        with urllib.request.urlopen(f"{self.base_url}/loopback/stats", timeout=10) as answer:
            return json.loads(answer.read())


@contextmanager
def serve_in_subprocess(**fields: Any) -> Iterator[RemoteLoopback]:  # noqa: ANN401
    """Run a loopback server in a child process (its own interpreter, its own GIL).

    Args:
        **fields: JSON-serialisable :class:`Behaviour` fields, e.g. ``latency_s=0.05``.

    Yields:
        A :class:`RemoteLoopback` with the server's ``base_url``.

    """
    Behaviour(**fields)  # reject unknown fields here, not in the child
    module = "slca_exp.services.loopback"
    command = [sys.executable, "-m", module, "--behaviour", json.dumps(fields)]
    process = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=dict(os.environ)
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.startswith("LOOPBACK_PORT="):
            raise RuntimeError(f"the loopback server did not start (said {line!r})")
        yield RemoteLoopback(f"http://127.0.0.1:{int(line.split('=', 1)[1])}/v1", process)
    finally:
        if process.stdin is not None:
            process.stdin.close()  # the child exits when its stdin closes
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def _main(args: argparse.Namespace) -> None:
    # Like vLLM's server: the key from $VLLM_API_KEY unless told where else to read it.
    key = os.environ.get(args.api_key_env or "VLLM_API_KEY") or None
    if args.api_key_env and not key:
        raise SystemExit(f"--api-key-env names {args.api_key_env}, which is not set")
    server = LoopbackServer(
        Behaviour(**json.loads(args.behaviour)),
        host=args.host,
        port=args.port,
        models=tuple(args.model or [DEFAULT_MODEL]),
        max_model_len=args.max_model_len,
        api_key=key,
    )
    await server.start()
    print(f"LOOPBACK_PORT={server.port}", flush=True)
    loop = asyncio.get_running_loop()
    if args.until_signal:
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    else:
        # Serve until the parent closes our stdin (or the process is terminated).
        await loop.run_in_executor(None, sys.stdin.read)
    await server.stop()


def main(argv: list[str] | None = None) -> None:
    """Command-line entry: serve until stdin closes; prints ``LOOPBACK_PORT=<port>`` first."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--behaviour", default="{}", help="JSON object of Behaviour fields")
    parser.add_argument("--host", default="127.0.0.1", help="a loopback address to bind")
    parser.add_argument("--port", type=int, default=0, help="0: a free port")
    parser.add_argument("--model", action="append", help="a model id to list (repeatable)")
    parser.add_argument("--max-model-len", type=int, default=None, help="in the model cards")
    parser.add_argument(
        "--api-key-env",
        default=None,
        help="NAME of the env var whose key requests must carry (default: $VLLM_API_KEY, if set)",
    )
    parser.add_argument(
        "--until-signal",
        action="store_true",
        help="serve until SIGTERM or SIGINT instead of until stdin closes (a service's job)",
    )
    args = parser.parse_args(argv)
    Behaviour(**json.loads(args.behaviour))  # reject unknown fields before listening
    asyncio.run(_main(args))


if __name__ == "__main__":
    main()
