"""HF <-> Megatron parity of the worker's converter, run under torchrun (any number of ranks,
a multiple of ``--tp``; gloo, CPU).

    python -m torch.distributed.run --standalone --nproc-per-node 2 parity.py --tp 2 --hf DIR...

For each ``DIR``: builds the trainer's ``GPTModel`` through ``tandem_megatron_worker.convert``,
loads ``DIR``, and prints (rank 0) one JSON line:

- ``logits_max_abs_diff``: full logits (gathered over TP) vs transformers'
  ``AutoModelForCausalLM`` (eager attention, float32) on 3 x 24 random token ids (seed 0);
- ``roundtrip_bit_exact``: HF -> Megatron shards -> HF (gathered, written with the worker's
  streaming safetensors writer, read back) gives the input's key set and ``torch.equal``
  tensors.
"""

import argparse
import json
import os
import sys
import tempfile

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tandem_megatron_worker import convert, cpu_patch, stream  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hf", required=True, nargs="+")
    ap.add_argument("--tp", type=int, required=True)
    args = ap.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    from megatron.core import parallel_state as ps

    ps.initialize_model_parallel(tensor_model_parallel_size=args.tp)
    cpu_patch.apply("cpu")
    cpu_patch.seed(0)
    for hf_dir in args.hf:
        check(hf_dir, args.tp, ps)
    dist.barrier()
    dist.destroy_process_group()


def check(hf_dir, tp, ps):
    """Logits and round trip of one model; rank 0 prints the JSON line."""
    from safetensors.torch import load_file

    tp_group, tp_rank = ps.get_tensor_model_parallel_group(), ps.get_tensor_model_parallel_rank()
    spec = convert.Spec(hf_dir, tp)
    model = convert.build_model(spec, tp, torch.float32, seq_length=64)
    convert.load_shards(model, convert.HfReader(hf_dir).get, spec, tp, tp_rank)
    model.eval()

    ids = torch.randint(0, spec.vocab, (3, 24), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(24).unsqueeze(0).expand(3, 24)
    mask = torch.ones((1, 1, 24, 24), dtype=torch.bool).triu(1)
    with torch.no_grad():
        local = model(ids, pos, mask).contiguous()
    parts = [torch.empty_like(local) for _ in range(tp)]
    dist.all_gather(parts, local, group=tp_group)
    logits = torch.cat(parts, -1)

    exported = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.safetensors")
        layout = convert.hf_layout(model, spec, tp)
        w = stream.Writer(path, layout, {"format": "pt"}) if tp_rank == 0 else None
        for n, t in convert.gather_hf(model, spec, tp_group, lambda _n, p: p.detach()):
            w.put(n, t)
        if w is not None:
            w.close()
            exported = load_file(path)

    if dist.get_rank() == 0:
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager")
        with torch.no_grad():
            ref = hf(input_ids=ids).logits
        original = load_file(os.path.join(hf_dir, "model.safetensors"))
        same_keys = set(original) == set(exported)
        unequal = sorted(k for k in original if k in exported and not torch.equal(original[k], exported[k]))
        result = {
            "model": hf_dir,
            "arch": spec.arch,
            "tied": spec.tied,
            "tp": tp,
            "world": dist.get_world_size(),
            "logits_max_abs_diff": float((logits - ref).abs().max()),
            "logits_max_abs": float(ref.abs().max()),
            "roundtrip_bit_exact": same_keys and not unequal,
            "roundtrip_tensors": len(exported),
            "roundtrip_key_diff": sorted(set(original) ^ set(exported)),
            "roundtrip_unequal": unequal,
        }
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
