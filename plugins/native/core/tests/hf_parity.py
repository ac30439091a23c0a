"""Logits parity: run Hugging Face transformers (torch, CPU, f32, eager attention) on a model
directory written by the native backend and compare with the logits it dumped.

Usage: python hf_parity.py DIR
With --adapter ADIR the PEFT adapter in ADIR is applied (checks our adapter files are valid
PEFT and that our LoRA forward matches PEFT's). DIR holds config.json + model.safetensors, parity.json {"tokens": [[...], ...]} and
parity_logits.f32 (little-endian f32, [B, T, vocab]). Prints one JSON line; exits 1 when the
max abs difference exceeds the tolerance (default 1e-4, override with --tol).
"""
import argparse
import json
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--adapter", help="PEFT LoRA adapter directory to apply (needs peft)")
    args = ap.parse_args()
    meta = json.load(open(f"{args.dir}/parity.json"))
    tokens = torch.tensor(meta["tokens"], dtype=torch.long)
    model = AutoModelForCausalLM.from_pretrained(
        args.dir, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    if args.adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, args.adapter).eval()
    with torch.no_grad():
        ref = model(tokens).logits.float().numpy()
    ours = np.fromfile(f"{args.dir}/parity_logits.f32", dtype="<f4").reshape(ref.shape)
    diff = float(np.abs(ref - ours).max())
    print(json.dumps({
        "model_type": model.config.model_type,
        "adapter": bool(args.adapter),
        "max_abs_diff": diff,
        "max_abs_logit": float(np.abs(ref).max()),
        "shape": list(ref.shape),
        "tol": args.tol,
    }))
    return 0 if diff <= args.tol else 1


if __name__ == "__main__":
    sys.exit(main())
