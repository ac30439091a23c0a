"""Tandem's `megatron` trainer worker: one process per rank under torchrun, driven by the
`megatron` plugin (libtandem_megatron.so) over the framed JSON channel of ``tandem_torchrun``.
A Megatron-Core ``GPTModel`` with tensor and data parallelism, loaded from and exported to HF
Llama/Qwen2 checkpoints. See plugins/megatron/NOTES.md."""
