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

The RL-shaped step of `tandem bench native` (bench/cli/src/native_rl.rs) adds
"prompt_lens": [B ints] (rows then differ in length), "micro_batch": M (sequences per
micro-batch, gradients accumulated, the token mean over the whole batch) and
"completion_only": true (the decoder's hidden states of every position, the LM head and
log-softmax over the completion positions only). Its answer adds "peak_rise_bytes" (peak
resident set, VmHWM reset through /proc/self/clear_refs before the model is loaded, minus the
resident set then) and "peak_bytes".

Prints one JSON line: {"median_s", "seconds": [...], "first_loss", "first_grad_norm",
"threads", "torch", "peak_rise_bytes", "peak_bytes"}. A missing torch/transformers is one line {"unavailable": why} and exit 3.
"""

import json
import statistics
import sys
import time


def status_kb(key):
    """A /proc/self/status field in kB (nan if unreadable)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key):
                    return float(line.split()[1])
    except OSError:
        pass
    return float("nan")


def reset_peak():
    """Resets the peak resident set (VmHWM) and returns the current one, bytes."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    return status_kb("VmRSS:") * 1024


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
    base_rss = reset_peak()
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
    rows = [list(r) for r in req["tokens"]]
    b = len(rows)
    plens = req.get("prompt_lens") or [int(req["prompt_len"])] * b
    adv_all = [float(a) for a in req["advantages"]]
    eps = float(req["clip_eps"])
    micro = int(req.get("micro_batch") or b)
    completion_only = bool(req.get("completion_only"))
    core = model.get_base_model() if req.get("lora") else model
    total = float(sum(len(r) - p for r, p in zip(rows, plens)))

    def parts():
        # Micro-batches of `micro` rows, right-padded to their longest; targets j >= prompt
        # length, i.e. logits at j - 1.
        for s in range(0, b, micro):
            rs = rows[s:s + micro]
            t = max(len(r) for r in rs)
            tokens = torch.tensor([r + [0] * (t - len(r)) for r in rs], dtype=torch.long)
            bi, ti = [], []
            for k, (r, p) in enumerate(zip(rs, plens[s:s + micro])):
                bi += [k] * (len(r) - p)
                ti += list(range(p - 1, len(r) - 1))
            bi, ti = torch.tensor(bi), torch.tensor(ti)
            adv = torch.tensor(adv_all[s:s + micro])[bi]
            yield tokens, bi, ti, adv

    def logprobs(tokens, bi, ti):
        if completion_only:
            h = core.model(input_ids=tokens).last_hidden_state[bi, ti]
            logits = core.lm_head(h)
        else:
            logits = model(input_ids=tokens).logits[bi, ti]
        return torch.log_softmax(logits, dim=-1).gather(-1, tokens[bi, ti + 1][:, None])[:, 0]

    with torch.no_grad():
        olds = [logprobs(tok, bi, ti) for tok, bi, ti, _ in parts()]

    def step():
        loss_sum = 0.0
        for (tok, bi, ti, adv), old in zip(parts(), olds):
            lp = logprobs(tok, bi, ti)
            r = torch.exp(lp - old)
            pg = -torch.minimum(r * adv, torch.clamp(r, 1.0 - eps, 1.0 + eps) * adv)
            loss = pg.sum() / total
            loss.backward()
            loss_sum += float(loss)
        norm = torch.nn.utils.clip_grad_norm_(params, float(req["grad_clip"]))
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss_sum, float(norm)

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
        "peak_rise_bytes": (status_kb("VmHWM:") * 1024) - base_rss,
        "peak_bytes": status_kb("VmHWM:") * 1024,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
