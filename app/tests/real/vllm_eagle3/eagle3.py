"""EAGLE-3 drafters saved by Tandem, loaded by real vLLM as its speculative model.

Run by app/tests/real/vllm_eagle3/mod.rs: `python eagle3.py CASE.json` prints one line
`EAGLE3_RESULT <json>` (vLLM logs to stdout too).
CASE: {"target": dir, "prompts": [[ids]], "max_tokens": n, "k": draft tokens,
       "drafters": [{"name": str, "dir": str}]}.

One `vllm.LLM` at a time, engine core and worker in this process (no multiprocessing:
a load is seconds, not a minute): greedy tokens without a drafter, then with each drafter
(`speculative_config = {"method": "eagle3", ...}`), its spec-decode counters, and the
drafter's parameters as vLLM's `Eagle3LlamaForCausalLM.load_weights` left them, compared
with the checkpoint's tensors. A failed load is reported as `error` (type and message).
"""

import gc
import json
import os
import sys
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def expected_params(path):
    """The checkpoint's tensors under the names and layout vLLM's EAGLE-3 Llama uses:
    `midlayer.` -> `model.layers.0.`, a `model.` prefix on all but `lm_head`, q/k/v rows
    stacked into `qkv_proj`, gate/up into `gate_up_proj`, `d2t` -> `draft_id_to_target_id`,
    `t2d` not loaded."""
    import torch
    from safetensors.torch import load_file

    exp = {}
    for name, t in load_file(path).items():
        if name == "t2d":
            continue
        if name == "d2t":
            exp["draft_id_to_target_id"] = t
        elif name == "lm_head.weight":
            exp[name] = t
        else:
            exp["model." + name.replace("midlayer.", "layers.0.")] = t
    stacks = [
        ("model.layers.0.self_attn.", ["q_proj", "k_proj", "v_proj"], "qkv_proj"),
        ("model.layers.0.mlp.", ["gate_proj", "up_proj"], "gate_up_proj"),
    ]
    for prefix, parts, fused in stacks:
        names = [f"{prefix}{p}.weight" for p in parts]
        if all(n in exp for n in names):
            exp[f"{prefix}{fused}.weight"] = torch.cat([exp.pop(n) for n in names])
    return exp


def compare(loaded, expected):
    """Names vLLM has but the checkpoint lacks, the reverse, and the names whose values
    differ (exactly: both are f32)."""
    import torch

    differ = [
        n
        for n in sorted(set(loaded) & set(expected))
        if loaded[n].shape != expected[n].shape
        or not torch.equal(loaded[n].to(expected[n].dtype), expected[n])
    ]
    return {
        "params": len(loaded),
        "missing": sorted(set(loaded) - set(expected)),
        "unused": sorted(set(expected) - set(loaded)),
        "differ": differ,
    }


def spec_counters(llm):
    """vLLM's speculative-decoding counters (`vllm:spec_decode_*`)."""
    out = {}
    for m in llm.get_metrics():
        if not m.name.startswith("vllm:spec_decode"):
            continue
        key = m.name.removeprefix("vllm:spec_decode_")
        if hasattr(m, "values"):
            out[key] = list(m.values)
        elif hasattr(m, "value"):
            out[key] = m.value
    return out


def main():
    with open(sys.argv[1]) as f:
        case = json.load(f)
    t0 = time.time()
    import torch
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.model_executor.models import llama_eagle3

    loaded = {}
    original = llama_eagle3.Eagle3LlamaForCausalLM.load_weights

    def recording(self, weights):
        r = original(self, weights)
        loaded.clear()
        loaded.update({n: p.detach().clone() for n, p in self.named_parameters()})
        return r

    llama_eagle3.Eagle3LlamaForCausalLM.load_weights = recording
    result = {
        "versions": {"vllm": vllm.__version__, "torch": torch.__version__},
        "import_s": round(time.time() - t0, 1),
        "drafters": {},
    }
    sampling = SamplingParams(
        temperature=0.0, max_tokens=case["max_tokens"], ignore_eos=True
    )
    prompts = [{"prompt_token_ids": p} for p in case["prompts"]]

    def generate(spec):
        t = time.time()
        llm = LLM(
            model=case["target"],
            speculative_config=spec,
            dtype="float32",
            max_model_len=256,
            max_num_seqs=len(prompts),
            enforce_eager=True,
            seed=0,
            generation_config="vllm",
            distributed_executor_backend="uni",
            disable_log_stats=False,
        )
        load_s = time.time() - t
        outs = llm.generate(prompts, sampling, use_tqdm=False)
        tokens = [list(o.outputs[0].token_ids) for o in outs]
        counters = spec_counters(llm)
        del llm
        gc.collect()
        return {"tokens": tokens, "spec": counters, "load_s": round(load_s, 1)}

    result["plain"] = generate(None)
    for d in case["drafters"]:
        spec = {
            "method": "eagle3",
            "model": d["dir"],
            "num_speculative_tokens": case["k"],
        }
        loaded.clear()
        try:
            r = generate(spec)
        except Exception as e:  # the test prints vLLM's refusal verbatim
            result["drafters"][d["name"]] = {"error": f"{type(e).__name__}: {e}"}
            continue
        st = os.path.join(d["dir"], "model.safetensors")
        r["weights"] = compare(loaded, expected_params(st))
        result["drafters"][d["name"]] = r
    result["total_s"] = round(time.time() - t0, 1)
    print("EAGLE3_RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
