"""The imported SmolLM2 directory against transformers' own GGUF loader.

Usage: python parity.py CASE.json LOGITS.f32
CASE.json: {"gguf": path, "dir": imported dir, "rows": [[ids]...] (equal lengths), "texts":
[...], "encodings": [[ids]...] (our tokenizer.json's ids of each text)}. LOGITS.f32: our logits
of `rows`, little-endian f32 [B, T, vocab]. Checks (1) logits against
`AutoModelForCausalLM.from_pretrained(gguf_file=...)`: our f32 logits as close to the same
model evaluated in f64 as transformers' own f32 logits are, within 1.5x (or 1e-4, whichever
is larger), and within 2e-4 of transformers' f32 logits. Two f32 evaluations of 30 layers
with logits up to ~38 differ by ~1e-4 from rounding alone, and how much depends on the CPU's
summation order (AVX-512 vs AVX2 kernels): transformers' f32 logits measured 0.96e-4 from f64
on one machine, ours 1.08e-4 there. So the f64 bound is set by the reference's own rounding in
the same run; a bug (a wrong rotary base, a missing norm) is off by orders more. (2) our ids == the GGUF-derived
tokenizer's for every text, (3) the imported dir's tokenizer (AutoTokenizer) renders the chat
template exactly as the GGUF-derived one. Prints one JSON line; exits 1 on any mismatch.
"""
import json
import os
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main() -> int:
    case = json.load(open(sys.argv[1]))
    folder, name = os.path.split(case["gguf"])
    ref_tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    tokens = torch.tensor(case["rows"], dtype=torch.long)
    with torch.no_grad():
        ref = model(tokens).logits.float().numpy()
    ours = np.fromfile(sys.argv[2], dtype="<f4").reshape(ref.shape)
    diff = float(np.abs(ref - ours).max())
    # Where both f32 results stand against the same model in f64: the scale of f32 rounding
    # over 30 layers, for reading the figure above.
    # (The GGUF-loaded model refuses casts; the imported directory holds the same weights.)
    f64 = AutoModelForCausalLM.from_pretrained(
        case["dir"], dtype=torch.float64, attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        exact = f64(tokens).logits.numpy()
    per_pos = np.abs(ref - ours).max(axis=(0, 2))

    mismatches = []
    for text, ids in zip(case["texts"], case["encodings"]):
        want = ref_tok.encode(text, add_special_tokens=False)
        if want != ids:
            mismatches.append({"text": text, "ours": ids[:20], "transformers": want[:20]})
    ours_tok = AutoTokenizer.from_pretrained(case["dir"])
    msgs = [{"role": "user", "content": "What is 17 + 25?"}]
    chat_ours = ours_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    chat_ref = ref_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    ids_ours = ours_tok.encode(chat_ours, add_special_tokens=False)
    ids_ref = ref_tok.encode(chat_ref, add_special_tokens=False)
    ours_exact = float(np.abs(exact - ours).max())
    ref_exact = float(np.abs(exact - ref).max())
    f64_bound = max(1e-4, 1.5 * ref_exact)
    ok = ours_exact <= f64_bound and diff <= 2e-4 and not mismatches and chat_ours == chat_ref and ids_ours == ids_ref
    print(json.dumps({
        "max_abs_diff": diff,
        "max_abs_logit": float(np.abs(ref).max()),
        "ours_vs_f64": ours_exact,
        "transformers_vs_f64": ref_exact,
        "f64_bound": f64_bound,
        "diff_by_position": [round(float(x), 7) for x in per_pos],
        "shape": list(ref.shape),
        "texts": len(case["texts"]),
        "encoding_mismatches": mismatches,
        "chat_template_equal": chat_ours == chat_ref,
        "chat_ids_equal": ids_ours == ids_ref,
        "ok": ok,
    }))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
