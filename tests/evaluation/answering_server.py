"""An OpenAI-compatible server that answers BFCL items with hand-made tool calls.

Served in place of vLLM through ``eval.command`` (the path a real eval takes: the served
checkpoint's id, BFCL's own client, generation and checker). Each chat completion is answered
with tool calls built from BFCL's possible answers (:func:`truth_table`): the correct ones when
the model id is listed in the answers file's ``correct`` (or it lists ``*``), otherwise the
same calls with the first argument's value changed to one no possible answer allows. Every
request's model id is appended to ``<answers file>.requests``.

    python answering_server.py --host H --port P --model ID --answers FILE
"""

from __future__ import annotations

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def truth_table(package: Path, categories: list[str]) -> dict[str, list[dict]]:
    """The question's key (:func:`key_of`) -> one correct call list, from BFCL's own files."""
    table = {}
    for category in categories:
        data = package / "data" / f"BFCL_v4_{category}.json"
        answers = package / "data" / "possible_answer" / f"BFCL_v4_{category}.json"
        truth = {e["id"]: e["ground_truth"] for e in map(json.loads, answers.open())}
        for entry in map(json.loads, data.open()):
            user = [m for m in entry["question"][0] if m["role"] == "user"][-1]["content"]
            names = [f["name"].replace(".", "_") for f in entry["function"]]
            table[key_of(user, names)] = [_call(c) for c in truth[entry["id"]]]
    return table


def key_of(question: str, tool_names: list[str]) -> str:
    return json.dumps([question, sorted(tool_names)])


def _call(possible: dict) -> dict:
    """One call that BFCL's checker accepts: each argument's first allowed value ("" omits)."""
    ((name, params),) = possible.items()
    arguments = {k: v[0] for k, v in params.items() if v and v[0] != ""}
    return {"name": name.replace(".", "_"), "arguments": arguments}


def wrong(calls: list[dict]) -> list[dict]:
    """The same calls, the first argument of the first given a value nothing allows."""
    calls = json.loads(json.dumps(calls))
    for call in calls:
        if call["arguments"]:
            arg = next(iter(call["arguments"]))
            value = call["arguments"][arg]
            if isinstance(value, bool):
                call["arguments"][arg] = "not a boolean"
            elif isinstance(value, int | float):
                call["arguments"][arg] = value + 123457
            else:
                call["arguments"][arg] = f"wrong {value}"
            return calls
    return [{"name": "no_such_function", "arguments": {}}]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--answers", type=Path, required=True)
    args = parser.parse_args()
    spec = json.loads(args.answers.read_text())
    table = truth_table(Path(spec["package"]), spec["categories"])
    correct = args.model in spec["correct"] or spec["correct"] == ["*"]
    log = Path(f"{args.answers}.requests")
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_args) -> None:
            pass

        def _send(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802
            if self.path.rstrip("/").endswith("/models"):
                card = {"id": args.model, "object": "model", "max_model_len": 4096}
                self._send(200, {"object": "list", "data": [card]})
            else:
                self._send(404, {"error": {"message": "not found"}})

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with lock, log.open("a") as out:
                out.write(body.get("model", "") + "\n")
            user = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
            names = [t["function"]["name"] for t in body.get("tools", [])]
            calls = table.get(key_of(user, names))
            if calls is None:
                self._send(400, {"error": {"message": "no such BFCL item"}})
                return
            calls = calls if correct else wrong(calls)
            tool_calls = [
                {
                    "id": f"call_{i}",
                    "type": "function",
                    "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])},
                }
                for i, c in enumerate(calls)
            ]
            message = {"role": "assistant", "content": None, "tool_calls": tool_calls}
            self._send(
                200,
                {
                    "id": "chatcmpl-answering",
                    "object": "chat.completion",
                    "created": 0,
                    "model": body.get("model"),
                    "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                },
            )

    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
