"""Self-test of check.py: good exchanges pass, bad ones fail naming the route and the field.

    "$(bash scripts/setup-python.sh | tail -n1)" python/sglang_contract/test_check.py

Plain asserts (no pytest); prints `test_check: N cases ok` and exits 0, or fails at the first
case that check.py judged wrongly. Imports sglang once (about 20 s on 2 cores).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check  # noqa: E402

GEN_REQ = {
    "input_ids": [1, 2, 3],
    "sampling_params": {"max_new_tokens": 4, "temperature": 1.0, "top_p": 1.0, "top_k": -1},
    "return_logprob": True,
    "rid": "r1",
}
GEN_RESP = {
    "text": "ab",
    "output_ids": [5, 6],
    "meta_info": {
        "id": "r1",
        "finish_reason": {"type": "length", "length": 2},
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "cached_tokens": 0,
        "weight_version": "3",
        "output_token_logprobs": [[-1.5, 5, None], [-0.25, 6, None]],
        "e2e_latency": 0.01,
    },
}
CMPL_RESP = {
    "id": "cmpl-1",
    "object": "text_completion",
    "created": 1,
    "model": "m",
    "choices": [{"index": 0, "text": "x", "finish_reason": "length",
                 "logprobs": {"text_offset": [0], "token_logprobs": [-1.0], "tokens": ["x"],
                              "top_logprobs": [{"x": -1.0}]}}],
    "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3},
}
LORA_OK = {"rid": None, "http_worker_ipc": None, "success": True, "error_message": None,
           "loaded_adapters": {"a1": {"lora_id": "i", "lora_name": "a1", "lora_path": "/p",
                                      "pinned": False}}}


def rec(method, path, request=None, response=None, status=200, query=None):
    return {"method": method, "path": path, "query": query, "status": status,
            "request": request, "response": response}


GOOD = [
    rec("GET", "/health_generate"),
    rec("POST", "/generate", GEN_REQ, GEN_RESP),
    rec("POST", "/generate", {"text": ["a", "b"], "sampling_params": {"max_new_tokens": 1}},
        [GEN_RESP, GEN_RESP]),
    rec("POST", "/generate", dict(GEN_REQ, stream=True), [
        dict(GEN_RESP, meta_info=dict(GEN_RESP["meta_info"], finish_reason=None)),
        dict(GEN_RESP, meta_info=dict(GEN_RESP["meta_info"],
                                      finish_reason={"type": "stop", "matched": 2})),
        {"error": {"message": "x", "type": "invalid_request_error", "code": 400,
                   "retryable": False}}]),
    rec("POST", "/generate", dict(GEN_REQ, lora_path="lora-v3"), dict(GEN_RESP, meta_info=dict(
        GEN_RESP["meta_info"], finish_reason={"type": "abort", "message": "aborted"}))),
    rec("POST", "/generate", {"input_ids": [1], "sampling_params": {"max_new_tokens": 1}},
        {"error": {"message": "aborted", "type": "invalid_request_error"}}, status=400),
    rec("POST", "/update_weights_from_disk", {"model_path": "/ckpt", "weight_version": "4"},
        {"success": True, "message": "ok", "num_paused_requests": 0}),
    rec("POST", "/update_weights_from_disk", {"model_path": "/ckpt"},
        {"success": False, "message": "lower version", "num_paused_requests": 0}, status=400),
    rec("POST", "/pause_generation", {"mode": "in_place"},
        {"message": "Generation paused successfully.", "status": "ok"}),
    rec("POST", "/continue_generation", {}),
    rec("GET", "/flush_cache", query="timeout=0", status=400, response="busy"),
    rec("POST", "/release_memory_occupation", {"tags": ["weights", "kv_cache"]}),
    rec("POST", "/resume_memory_occupation", {"tags": None}, {"error": {"message": "x"}}, 400),
    rec("POST", "/abort_request", {"abort_all": True}),
    rec("POST", "/update_weight_version", {"new_version": "5"}),
    rec("POST", "/load_lora_adapter", {"lora_name": "a1", "lora_path": "/p"}, LORA_OK),
    rec("POST", "/unload_lora_adapter", {"lora_name": "a1"}, dict(LORA_OK, loaded_adapters={})),
    rec("POST", "/weights_checker", {"action": "checksum"},
        {"success": True, "message": "ok", "checksum": "ab12"}),
    rec("GET", "/v1/loads", query="include=core", response={}),
    rec("GET", "/v1/models", response={"object": "list", "data": [{"id": "m", "object": "model",
                                                                    "owned_by": "tandem"}]}),
    rec("POST", "/v1/completions", {"model": "m", "prompt": [1, 2], "max_tokens": 1,
                                    "logprobs": 1}, CMPL_RESP),
    rec("POST", "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "logprobs": True},
        {"object": "error", "message": "bad", "type": "Bad Request", "param": None, "code": 400},
        status=400),
]

# (record, substrings the failure line must contain)
BAD = [
    (rec("POST", "/generate", dict(GEN_REQ, sampling_params={"max_new_tokens": 4, "foo": 1})),
     ["POST /generate", "request field sampling_params", "unknown field `foo`"]),
    (rec("POST", "/generate", {"sampling_params": {"max_new_tokens": 1}}),
     ["POST /generate", "normalize_batch_and_arguments"]),
    (rec("POST", "/generate", {"input_ids": "not ids"}), ["POST /generate", "input_ids"]),
    (rec("POST", "/update_weights_from_disk", {"weight_version": "4"}),
     ["/update_weights_from_disk", "model_path"]),
    (rec("POST", "/load_lora_adapter", {"lora_name": "a1"}), ["/load_lora_adapter", "lora_path"]),
    (rec("POST", "/pause_generation", {"mode": "sometimes"}), ["/pause_generation", "mode"]),
    (rec("POST", "/update_weight_version", {"abort_all_requests": True}),
     ["/update_weight_version", "new_version"]),
    (rec("GET", "/flush_cache", query="timeout=-1"), ["/flush_cache", "query field timeout"]),
    (rec("POST", "/continue_generation"), ["/continue_generation", "request: Field required"]),
    (rec("POST", "/no_such_route", {}), ["/no_such_route", "not a route of sglang 0.5.23"]),
    (rec("GET", "/generate"), ["GET /generate", "not a route"]),
    (rec("POST", "/generate", GEN_REQ, dict(GEN_RESP, meta_info=dict(
        GEN_RESP["meta_info"], output_token_logprobs=[["x", 5, None]]))),
     ["POST /generate", "response"]),
    (rec("POST", "/generate", GEN_REQ, dict(GEN_RESP, meta_info=dict(
        GEN_RESP["meta_info"], finish_reason="length"))),  # OpenAI's string, not SGLang's map
     ["POST /generate", "GenerateResponse", "expected map"]),
    (rec("POST", "/generate", GEN_REQ, {"text": "ab", "output_ids": [5]}),
     ["POST /generate", "meta_info"]),
    (rec("POST", "/update_weights_from_disk", {"model_path": "/c"}, {"message": "ok"}),
     ["/update_weights_from_disk", "success"]),
    (rec("POST", "/load_lora_adapter", {"lora_name": "a", "lora_path": "/p"},
         dict(LORA_OK, loaded_adapters={"a": {"name": "a"}})),
     ["/load_lora_adapter", "loaded_adapters.a.name"]),
    (rec("POST", "/v1/completions", {"model": "m", "prompt": "hi"},
         {k: v for k, v in CMPL_RESP.items() if k != "usage"}),
     ["/v1/completions", "usage"]),
    (rec("POST", "/v1/completions", {"model": "m", "prompt": "hi", "stream": True},
         [{"id": "c", "created": 1, "model": "m", "choices": [{"index": 0}]}]),
     ["/v1/completions", "frame 0", "text"]),
    (rec("POST", "/v1/chat/completions", {"model": "m", "messages": "hi"}),
     ["/v1/chat/completions", "messages"]),
    (rec("POST", "/abort_request", {"abort_all": True}, {"detail": "nope"}, status=400),
     ["/abort_request", "error shapes"]),
]


def run(records, contract):
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        path = f.name
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return 0, check.check_trace(path, contract), err.getvalue()
    except SystemExit as e:
        return e.code, None, err.getvalue()
    finally:
        os.unlink(path)


def main() -> None:
    contract = check.Contract()
    code, counts, err = run(GOOD, contract)
    assert code == 0, f"the good trace failed: {err}"
    assert counts[0] == len(GOOD), counts
    assert counts[1] >= 12, counts
    for i, (bad, want) in enumerate(BAD):
        code, _, err = run([GOOD[0], bad], contract)
        assert code == 1, f"bad case {i} ({bad['path']}) passed; it should fail with {want}"
        assert ":2: " in err, f"bad case {i}: no line number 2 in {err!r}"
        for w in want:
            assert w in err, f"bad case {i}: {w!r} not in {err!r}"
    print(f"test_check: {len(GOOD)} good exchanges, {len(BAD)} bad ones caught")


if __name__ == "__main__":
    main()
