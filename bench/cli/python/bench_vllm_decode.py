"""`tandem bench native`: vLLM's offline decode on the prompts the native engine decoded.

Usage: python bench_vllm_decode.py REQUEST.json

REQUEST.json: {"model": DIR, "prompts": [[ids...], ...], "new_tokens": N, "batches": [1, 8, 64],
"reps": R}. One warm-up call at the largest batch, then for each batch size b the
first b prompts are generated R times, timed: greedy, exactly N new tokens per prompt
(ignore_eos, no stop). tok/s = b * N / wall seconds of `LLM.generate` (prefill included), the
median of the R runs. Progress lines on stderr start with "tandem-bench: ".

Prints one JSON line: {"decode": [{"batch", "tokens_per_s", "seconds": [...]}], "load_s",
"bind", "vllm"}. A missing vLLM is one line {"unavailable": why} and exit 3.
"""

import json
import os
import statistics
import sys
import time


def main() -> int:
    with open(sys.argv[1]) as f:
        req = json.load(f)
    # vLLM binds its CPU worker's OpenMP threads itself ("auto": one thread per physical core
    # of the NUMA node, less the cores it reserves for its scheduler process). Binding every
    # core to the model instead measured 2.5x slower on 2 cores (the scheduler then fights the
    # model's threads), so the reference is vLLM as it configures itself, unless the caller
    # sets VLLM_CPU_OMP_THREADS_BIND.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    for k, v in [("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"),
                 ("VLLM_NO_USAGE_STATS", "1"), ("DO_NOT_TRACK", "1")]:
        os.environ.setdefault(k, v)
    try:
        import vllm
        from vllm import LLM, SamplingParams
    except Exception as e:  # noqa: BLE001 - any import failure means "no vLLM here"
        print(json.dumps({"unavailable": f"vllm does not import: {type(e).__name__}: {e}"}))
        return 3

    prompts = req["prompts"]
    new_tokens = int(req["new_tokens"])
    batches = [int(b) for b in req["batches"]]
    t = time.perf_counter()
    llm = LLM(
        model=req["model"],
        dtype="float32",
        max_model_len=len(prompts[0]) + new_tokens + 16,
        max_num_seqs=max(batches),
        seed=0,
    )
    load_s = time.perf_counter() - t
    # Token ids out, as the native engine returns them: no detokenizing.
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True, temperature=0.0,
                            detokenize=False)
    print(f"tandem-bench: vLLM {vllm.__version__}: model loaded in {load_s:.1f} s", file=sys.stderr)
    warm = [{"prompt_token_ids": p} for p in prompts[:max(batches)]]
    llm.generate(warm, params, use_tqdm=False)
    out = []
    for b in batches:
        batch = [{"prompt_token_ids": p} for p in prompts[:b]]
        seconds = []
        for _ in range(int(req["reps"])):
            t = time.perf_counter()
            res = llm.generate(batch, params, use_tqdm=False)
            seconds.append(time.perf_counter() - t)
            got = [len(r.outputs[0].token_ids) for r in res]
            if got != [new_tokens] * b:
                raise SystemExit(f"vLLM generated {got} tokens, expected {new_tokens} each")
        out.append({
            "batch": b,
            "tokens_per_s": b * new_tokens / statistics.median(seconds),
            "seconds": seconds,
        })
        print(f"tandem-bench: vLLM: decode b{b}: {out[-1]['tokens_per_s']:.1f} tok/s", file=sys.stderr)
    print(json.dumps({
        "decode": out,
        "load_s": load_s,
        "bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto"),
        "vllm": vllm.__version__,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
