"""`tandem bench native`: PyTorch's GRPO train step on the batch the native trainer trained on.

Usage: python bench_torch_step.py REQUEST.json

REQUEST.json: {"model": DIR, "tokens": [[ids...], ...] (B rows of T), "prompt_len": P,
"advantages": [B floats], "lr", "clip_eps", "grad_clip", "steps": S, "threads": N,
"lora": null | {"rank", "alpha"}}.

HF `AutoModelForCausalLM` in float32 (PEFT LoRA on all seven projections when `lora` is set),
`torch.set_num_threads(N)`. The loss is the native trainer's GRPO policy loss (the shared
definition in plugins/native/core/src/loss.rs): token j of a row is the target of the logits
at j - 1; completion tokens (j >= P) count; r = exp(lp - old), pg = -min(r A, clip(r) A), the
token-level mean over the batch; no KL. `old` are the current policy's logprobs (computed once,
untimed, as the engine would have sampled them). One step = forward + loss + backward +
grad-norm clip + AdamW (betas 0.9/0.999, eps 1e-8, no weight decay). One warm-up step, then S
timed; the median is reported. Progress lines on stderr start with "tandem-bench: ".

`tandem bench native` runs it with MALLOC_MMAP_MAX_=0, MALLOC_TRIM_THRESHOLD_=68719476736 and
OMP_WAIT_POLICY=PASSIVE unless they are set (why: bench/cli/src/native_ref.rs); run by
hand, set them too.

Prints one JSON line: {"median_s", "seconds": [...], "first_loss", "first_grad_norm",
"threads", "torch"}. A missing torch/transformers is one line {"unavailable": why} and exit 3.
"""

import json
import statistics
import sys
import time


def main() -> int:
    with open(sys.argv[1]) as f:
        req = json.load(f)
    try:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM
    except Exception as e:  # noqa: BLE001 - any import failure means "no torch here"
        print(json.dumps({"unavailable": f"torch/transformers do not import: {e}"}))
        return 3
    threads = int(req["threads"])
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(req["model"], dtype=torch.float32)
    if req.get("lora"):
        try:
            from peft import LoraConfig, get_peft_model
        except Exception as e:  # noqa: BLE001
            print(json.dumps({"unavailable": f"peft does not import: {e}"}))
            return 3
        lora = req["lora"]
        model = get_peft_model(model, LoraConfig(
            r=int(lora["rank"]),
            lora_alpha=float(lora["alpha"]),
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                            "gate_proj", "up_proj", "down_proj"],
            lora_dropout=0.0,
            bias="none",
        ))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=float(req["lr"]), betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.0)
    tokens = torch.tensor(req["tokens"], dtype=torch.long)
    b, t = tokens.shape
    p = int(req["prompt_len"])
    mask = torch.zeros(b, t - 1)
    mask[:, p - 1:] = 1.0  # targets j >= p, i.e. shifted positions j - 1 >= p - 1
    adv = torch.tensor(req["advantages"], dtype=torch.float32)[:, None]
    eps = float(req["clip_eps"])

    def logprobs():
        logits = model(input_ids=tokens).logits[:, :-1, :]
        return torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, 1:, None])[..., 0]

    with torch.no_grad():
        old = logprobs()

    def step():
        lp = logprobs()
        r = torch.exp(lp - old)
        pg = -torch.minimum(r * adv, torch.clamp(r, 1.0 - eps, 1.0 + eps) * adv)
        loss = (pg * mask).sum() / mask.sum()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, float(req["grad_clip"]))
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss), float(norm)

    first_loss, first_norm = step()  # warm-up
    seconds = []
    for i in range(int(req["steps"])):
        t0 = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - t0)
        print(f"tandem-bench: torch: step {i + 1}: {seconds[-1]:.2f} s", file=sys.stderr)
    print(json.dumps({
        "median_s": statistics.median(seconds),
        "seconds": seconds,
        "first_loss": first_loss,
        "first_grad_norm": first_norm,
        "threads": threads,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
