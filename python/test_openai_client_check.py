"""Self-test of openai_client_check.py against a tiny in-process stub server (SGLang's shapes).

    "$(bash scripts/setup-python.sh | tail -n1)" python/test_openai_client_check.py

The stub answers /v1/completions and /v1/chat/completions (plain and SSE) with fixed tokens and
logprobs in the shapes of SGLang 0.5.23's protocol.py (token_ids / response_token_ids); the
script must print them back. Port 0 (the OS picks); plain asserts; prints one line when green.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

IDS, TOKENS, LPS = [7, 8], ["a", "b"], [-0.5, -1.25]
USAGE = {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}


def _cmpl_choice(i: int, stream: bool) -> dict:
    sl = slice(i, i + 1) if stream else slice(None)
    return {"index": 0, "text": "".join(TOKENS[sl]), "token_ids": IDS[sl],
            "prompt_token_ids": [1, 2] if not stream or i == 0 else None,
            "finish_reason": "length" if not stream or i == 1 else None,
            "logprobs": {"text_offset": [0] * len(TOKENS[sl]), "tokens": TOKENS[sl],
                         "token_logprobs": LPS[sl], "top_logprobs": [{}] * len(TOKENS[sl])}}


def _chat_lp(sl: slice) -> dict:
    return {"content": [{"token": t, "logprob": lp, "bytes": None, "top_logprobs": []}
                        for t, lp in zip(TOKENS[sl], LPS[sl])]}


class Stub(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert body.get("return_token_ids") is True, body
        chat = self.path.endswith("/chat/completions")
        head = {"id": "x", "created": 1, "model": body["model"]}
        if not body.get("stream"):
            if chat:
                choice = {"index": 0, "finish_reason": "length", "logprobs": _chat_lp(slice(None)),
                          "message": {"role": "assistant", "content": "ab"},
                          "response_token_ids": IDS, "prompt_token_ids": [1, 2]}
                out = dict(head, object="chat.completion", choices=[choice], usage=USAGE)
            else:
                out = dict(head, object="text_completion", choices=[_cmpl_choice(0, False)],
                           usage=USAGE)
            data = json.dumps(out).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i in range(2):
            if chat:
                choice = {"index": 0, "delta": {"content": TOKENS[i]},
                          "logprobs": _chat_lp(slice(i, i + 1)),
                          "finish_reason": "length" if i == 1 else None}
                frame = dict(head, object="chat.completion.chunk", choices=[choice])
            else:
                frame = dict(head, object="text_completion", choices=[_cmpl_choice(i, True)])
            self.wfile.write(b"data: " + json.dumps(frame).encode() + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "openai_client_check.py")
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        run = subprocess.run([sys.executable, script, url, "tiny", "--max-tokens", "2"],
                             capture_output=True, text=True, timeout=120)
    finally:
        server.shutdown()
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert sorted(out) == ["chat", "chat_stream", "completion", "completion_stream"], out
    for name, r in out.items():
        assert r["logprobs"] == LPS, (name, r)
        assert r["tokens"] == TOKENS, (name, r)
        assert r["text"] == "ab", (name, r)
        assert r["finish_reason"] == "length", (name, r)
        want_ids = None if name == "chat_stream" else IDS  # SGLang streams no chat token ids
        assert r["token_ids"] == want_ids, (name, r)
    assert out["completion"]["prompt_token_ids"] == [1, 2], out
    print("test_openai_client_check: 4 calls through the openai client ok")


if __name__ == "__main__":
    main()
