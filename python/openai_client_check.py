"""Drives an OpenAI-compatible server with the real `openai` client (PyPI) and prints what it got.

    python python/openai_client_check.py URL MODEL_NAME [--prompt TEXT] [--max-tokens N]
                                         [--api-key KEY] [--timeout S]

URL is the server's root (`http://127.0.0.1:30000`; `/v1` is added when missing). Four calls,
greedy (temperature 0) with logprobs: a completion, a streamed completion, a chat completion and a
streamed chat completion. SGLang's `return_token_ids` extension is asked for through
`extra_body`; completions answer it with `choices[].token_ids` / `prompt_token_ids`, chat with
`choices[].response_token_ids` / `prompt_token_ids` (SGLang 0.5.23's protocol.py); a server that
does not send them gets `null` there (the text and the logprob tokens are printed either way).

Prints ONE JSON object on stdout, for a test to compare with `tandem generate --score`:
  {"completion": R, "completion_stream": R, "chat": R, "chat_stream": R}
  R = {"text", "token_ids" (or null), "prompt_token_ids" (or null), "tokens", "logprobs",
       "finish_reason"}
Exits 1 with one line on stderr when a call fails or a response lacks logprobs.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Optional

import openai


def _extra(obj: Any, name: str) -> Optional[Any]:
    """A field the openai models do not declare (kept in model_extra), or None."""
    value = getattr(obj, name, None)
    if value is None and getattr(obj, "model_extra", None):
        value = obj.model_extra.get(name)
    return value


def _result(text, token_ids, prompt_ids, tokens, logprobs, finish) -> dict:
    if not logprobs or len(logprobs) != len(tokens):
        raise RuntimeError(f"no per-token logprobs in the response ({len(logprobs or [])} values)")
    return {"text": text, "token_ids": token_ids, "prompt_token_ids": prompt_ids,
            "tokens": tokens, "logprobs": logprobs, "finish_reason": finish}


def completion(client, model, prompt, max_tokens, stream: bool) -> dict:
    args = dict(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0, logprobs=1,
                extra_body={"return_token_ids": True})
    if not stream:
        choice = client.completions.create(**args).choices[0]
        lp = choice.logprobs
        return _result(choice.text, _extra(choice, "token_ids"), _extra(choice, "prompt_token_ids"),
                       list(lp.tokens or []) if lp else [],
                       list(lp.token_logprobs or []) if lp else [], choice.finish_reason)
    text, ids, prompt_ids, tokens, logprobs, finish = "", [], None, [], [], None
    for chunk in client.completions.create(stream=True, **args):
        for choice in chunk.choices:
            text += choice.text or ""
            ids.extend(_extra(choice, "token_ids") or [])
            prompt_ids = prompt_ids or _extra(choice, "prompt_token_ids")
            if choice.logprobs:
                tokens.extend(choice.logprobs.tokens or [])
                logprobs.extend(choice.logprobs.token_logprobs or [])
            finish = choice.finish_reason or finish
    return _result(text, ids or None, prompt_ids, tokens, logprobs, finish)


def chat(client, model, prompt, max_tokens, stream: bool) -> dict:
    args = dict(model=model, messages=[{"role": "user", "content": prompt}],
                max_tokens=max_tokens, temperature=0, logprobs=True,
                extra_body={"return_token_ids": True})
    if not stream:
        # The prompt's ids come back only when asked (SGLang refuses the flag on a stream).
        args["extra_body"] = {"return_token_ids": True, "return_prompt_token_ids": True}
        choice = client.chat.completions.create(**args).choices[0]
        content = (choice.logprobs.content or []) if choice.logprobs else []
        return _result(choice.message.content, _extra(choice, "response_token_ids"),
                       _extra(choice, "prompt_token_ids"), [c.token for c in content],
                       [c.logprob for c in content], choice.finish_reason)
    text, ids, tokens, logprobs, finish = "", [], [], [], None
    for chunk in client.chat.completions.create(stream=True, **args):
        for choice in chunk.choices:
            text += (choice.delta.content or "") if choice.delta else ""
            ids.extend(_extra(choice, "response_token_ids") or [])
            for c in (choice.logprobs.content or []) if choice.logprobs else []:
                tokens.append(c.token)
                logprobs.append(c.logprob)
            finish = choice.finish_reason or finish
    return _result(text, ids or None, None, tokens, logprobs, finish)


def main(argv: list) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("url")
    p.add_argument("model")
    p.add_argument("--prompt", default="Hello, world")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--api-key", default="none")
    p.add_argument("--timeout", type=float, default=120.0)
    a = p.parse_args(argv[1:])
    base = a.url.rstrip("/")
    if not base.endswith("/v1"):
        base += "/v1"
    client = openai.OpenAI(base_url=base, api_key=a.api_key, timeout=a.timeout, max_retries=0)
    out = {}
    for name, fn, stream in [("completion", completion, False),
                             ("completion_stream", completion, True),
                             ("chat", chat, False), ("chat_stream", chat, True)]:
        try:
            out[name] = fn(client, a.model, a.prompt, a.max_tokens, stream)
        except (openai.OpenAIError, RuntimeError, AttributeError, TypeError) as e:
            print(f"openai_client_check: {name}: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
