"""PEFT side of tests/peft_parity.rs.

`make DIR`: a small random Llama base per case (F32, BF16) and a PEFT LoRA adapter with
random B (plain LoRA on attention, rsLoRA on every projection) under DIR.
`check DIR`: compares each `DIR/<case>/merged` (written by `tandem_model::merge`) with PEFT's
`merge_and_unload()` of the same base and adapter; prints one JSON line of the largest
differences (weights, and logprobs of a fixed sequence against the unmerged PEFT model).
"""
import json
import sys

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, LlamaConfig

CASES = {
    "f32-rslora": (torch.float32, dict(r=4, lora_alpha=8, use_rslora=True,
                                       target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                       "gate_proj", "up_proj", "down_proj"])),
    "bf16-lora": (torch.bfloat16, dict(r=8, lora_alpha=16, use_rslora=False,
                                       target_modules=["q_proj", "v_proj"])),
}
IDS = torch.tensor([[1, 5, 9, 17, 33, 2, 60, 11]])


def make(root):
    for name, (dtype, lora) in CASES.items():
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          max_position_embeddings=64, tie_word_embeddings=False)
        base = AutoModelForCausalLM.from_config(cfg).to(dtype)
        base.save_pretrained(f"{root}/{name}/base")
        peft = get_peft_model(base, LoraConfig(init_lora_weights=False, **lora))
        peft.save_pretrained(f"{root}/{name}/adapter")


def logprobs(model):
    with torch.no_grad():
        return torch.log_softmax(model(IDS).logits.float(), -1)


def check(root):
    out = {}
    for name, (dtype, _) in CASES.items():
        load = lambda d: AutoModelForCausalLM.from_pretrained(f"{root}/{name}/{d}", dtype=dtype)
        peft = PeftModel.from_pretrained(load("base"), f"{root}/{name}/adapter")
        unmerged = logprobs(peft)
        reference = peft.merge_and_unload().state_dict()
        merged = load("merged")
        ours = merged.state_dict()
        assert merged.dtype == dtype, (name, merged.dtype)
        out[name] = {
            "weights": max((reference[k].float() - ours[k].float()).abs().max().item()
                           for k in reference),
            "logprobs": (logprobs(merged) - unmerged).abs().max().item(),
            "adapter_effect": (logprobs(load("base")) - unmerged).abs().max().item(),
        }
    print(json.dumps(out))


if __name__ == "__main__":
    {"make": make, "check": check}[sys.argv[1]](sys.argv[2])
