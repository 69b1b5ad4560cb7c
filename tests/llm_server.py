"""A local OpenAI-compatible chat server whose replies are scripted, for tests and demos.

`scripted_openai_server(actions_or_responder)` starts it on a free port and yields the server;
point a client at `server.base_url` ("http://127.0.0.1:<port>/v1"). Each `POST /v1/chat/completions`
is answered by the next action of the script, or by `responder(request_json) -> action`. An action is
a dict:

- `{"content": "...", "finish_reason": "stop" | "length", "usage": {"prompt_tokens": N, "completion_tokens": M}}`
  (finish_reason and usage optional; default usage estimates 4 characters per token),
- `{"status": 429}` (any HTTP error status, answered with an OpenAI-style error body; "message" optional),
- `{"hang_s": 30}` (wait that long before answering; may be combined with content or status).

Every request is recorded in `server.requests` as `{"path": ..., "body": <parsed JSON or None>}`.

Run as a script, it serves kernels from a directory so kforge can be tried without a real model:
`python tests/llm_server.py --port 8765 --reply-dir kernels_ref/cpu` answers a prompt containing
`problem_id: 1_relu` with the content of `kernels_ref/cpu/1_relu.py` in a fenced block.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

Action = dict[str, Any]
Responder = Callable[[dict[str, Any]], Action]

# (type, code) of OpenAI's error bodies, by HTTP status.
ERROR_KINDS = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("permission_error", None),
    404: ("invalid_request_error", "model_not_found"),
    429: ("requests", "rate_limit_exceeded"),
    500: ("server_error", None),
    503: ("server_error", "service_unavailable"),
}


def _message_text(message: dict[str, Any]) -> str:
    """Text of one chat message; content may be a string or a list of typed parts."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def _completion_body(request_json: dict[str, Any], action: Action) -> dict[str, Any]:
    content = action.get("content", "")
    prompt_chars = sum(len(_message_text(m)) for m in request_json.get("messages", []))
    usage = {
        "prompt_tokens": max(1, prompt_chars // 4),
        "completion_tokens": max(1, len(content) // 4),
        **action.get("usage", {}),
    }
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request_json.get("model", "scripted"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": action.get("finish_reason", "stop"),
                "logprobs": None,
            }
        ],
        "usage": usage,
    }


def _error_body(status: int, message: str) -> dict[str, Any]:
    error_type, code = ERROR_KINDS.get(status, ("server_error" if status >= 500 else "invalid_request_error", None))
    return {"error": {"message": message, "type": error_type, "param": None, "code": code}}


class ScriptedOpenAIServer(ThreadingHTTPServer):
    """The HTTP server; `base_url`, `requests` and `stop()` are its public surface."""

    daemon_threads = True
    # A handler may be mid-hang when the test ends; never wait for it on close.
    block_on_close = False

    def __init__(self, actions_or_responder: list[Action] | Responder, host: str = "127.0.0.1", port: int = 0):
        super().__init__((host, port), _Handler)
        if callable(actions_or_responder):
            self._responder, self._script = actions_or_responder, None
        else:
            self._responder, self._script = None, list(actions_or_responder)
        self._next_action = 0
        self._lock = threading.Lock()
        self.stopping = threading.Event()
        self.requests: list[dict[str, Any]] = []
        self.base_url = f"http://{host}:{self.server_address[1]}/v1"

    def record(self, path: str, body: dict[str, Any] | None) -> None:
        with self._lock:
            self.requests.append({"path": path, "body": body})

    def action_for(self, request_json: dict[str, Any]) -> Action:
        if self._responder is not None:
            return self._responder(request_json)
        with self._lock:
            index = self._next_action
            self._next_action += 1
        if index >= len(self._script):
            return {"status": 500, "message": f"the script is exhausted: it has {len(self._script)} actions"}
        return self._script[index]

    def stop(self) -> None:
        """Stop serving; wakes handlers that are hanging so they end at once."""
        self.stopping.set()
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: ScriptedOpenAIServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send_json(self, status: int, body: dict[str, Any]) -> None:
        payload = json.dumps(body).encode()
        # The client may have timed out and gone away while we hung.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    def do_GET(self) -> None:
        self.server.record(self.path, None)
        if self.path.rstrip("/") == "/v1/models":
            model = {"id": "scripted", "object": "model", "created": 0, "owned_by": "kforge-tests"}
            self._send_json(200, {"object": "list", "data": [model]})
        else:
            self._send_json(404, _error_body(404, f"no route GET {self.path}"))

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        try:
            request_json = json.loads(self.rfile.read(length) or b"null")
        except json.JSONDecodeError as error:
            self.server.record(self.path, None)
            self._send_json(400, _error_body(400, f"request body is not JSON: {error}"))
            return
        self.server.record(self.path, request_json)
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._send_json(404, _error_body(404, f"no route POST {self.path}"))
            return
        if not isinstance(request_json, dict) or request_json.get("stream"):
            self._send_json(400, _error_body(400, "this server answers non-streaming chat completions only"))
            return
        try:
            action = self.server.action_for(request_json)
        except Exception as error:  # a responder bug should reach the test as a 500, not a dropped socket
            action = {"status": 500, "message": f"responder raised {type(error).__name__}: {error}"}
        if self.server.stopping.wait(action.get("hang_s", 0)):
            return
        status = action.get("status", 200)
        if status == 200:
            self._send_json(200, _completion_body(request_json, action))
        else:
            self._send_json(status, _error_body(status, action.get("message", f"scripted error {status}")))


@contextlib.contextmanager
def scripted_openai_server(actions_or_responder: list[Action] | Responder) -> Iterator[ScriptedOpenAIServer]:
    """Serve the script (list of actions, or a responder) on 127.0.0.1 at a free port until the block ends."""
    server = ScriptedOpenAIServer(actions_or_responder)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.stop()
        thread.join(timeout=5)


PROBLEM_ID = re.compile(r"problem_id: (\S+)")


def reply_dir_responder(reply_dir: Path) -> Responder:
    """A responder that answers a prompt naming `problem_id: <id>` with `reply_dir/<id>.py` in a fenced block."""
    reply_dir = reply_dir.resolve()

    def respond(request_json: dict[str, Any]) -> Action:
        text = "\n".join(_message_text(m) for m in request_json.get("messages", []))
        problem_ids = PROBLEM_ID.findall(text)
        if not problem_ids:
            return {"content": "I cannot tell which problem this is: the prompt has no `problem_id: <id>` line."}
        problem_id = problem_ids[-1]
        path = (reply_dir / f"{problem_id}.py").resolve()
        if path.parent != reply_dir or not path.is_file():
            return {"content": f"I have no kernel for problem {problem_id} (looked for {path})."}
        source = path.read_text().rstrip("\n")
        return {"content": f"Here is a kernel for {problem_id}.\n\n```python\n{source}\n```\n"}

    return respond


def main() -> None:
    parser = argparse.ArgumentParser(description="Serve an OpenAI-compatible endpoint that replies with files.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--reply-dir", type=Path, required=True, help="directory of <problem_id>.py replies")
    args = parser.parse_args()
    if not args.reply_dir.is_dir():
        parser.error(f"--reply-dir {args.reply_dir} is not a directory")
    server = ScriptedOpenAIServer(reply_dir_responder(args.reply_dir), host=args.host, port=args.port)
    print(f"serving {args.reply_dir} at {server.base_url}  (Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.stopping.set()
        server.server_close()


if __name__ == "__main__":
    main()
