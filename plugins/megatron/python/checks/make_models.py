"""Writes tiny random Hugging Face models the converter must handle beside the tied Llama of
``tandem model init``: an untied Llama (8 heads, 2 KV groups) and a Qwen2 with qkv biases,
untied. Norm weights are drawn from uniform(0.5, 1.5) and biases at random, so a wrong norm or
bias mapping shows in the logits.

    python make_models.py OUT_DIR      # writes OUT_DIR/llama-untied and OUT_DIR/qwen2
"""

import os
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

COMMON = dict(
    vocab_size=512,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    max_position_embeddings=128,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=False,
)


def randomise(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            elif name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)


def main(out):
    llama = LlamaForCausalLM(LlamaConfig(num_attention_heads=8, num_key_value_heads=2, **COMMON))
    qwen = Qwen2ForCausalLM(Qwen2Config(num_attention_heads=4, num_key_value_heads=2, **COMMON))
    for name, model, seed in (("llama-untied", llama, 1), ("qwen2", qwen, 2)):
        randomise(model, seed)
        model.save_pretrained(os.path.join(out, name))


if __name__ == "__main__":
    torch.manual_seed(0)
    main(sys.argv[1])
