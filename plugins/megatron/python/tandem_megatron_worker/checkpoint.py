"""Checkpoints and exports of the Megatron trainer: HF safetensors gathered over TP one
parameter at a time and streamed to disk on global rank 0, the AdamW moments in the same HF
layout (so a checkpoint loads at any ``tp``), the trainer state file, atomic publication of
exports. A mixin of ``MegatronTrainer`` (it reads the trainer's model, optimizer and groups).
"""

import json
import os

import torch

from tandem_torchrun.export import Digest, Version
from tandem_torchrun.files import dir_bytes, read_state, saved_version, write_state

from . import convert, stream


class CheckpointOps:
    """``op_save_checkpoint``, ``op_load_checkpoint``, ``op_export`` and their helpers."""

    def _has_moments(self):
        return all("exp_avg" in self.optim.state.get(p, {}) for p in self._params())

    def _write_tensors(self, files, path, sources, digest=None):
        """Gathers HF tensors over TP one parameter at a time (DP rank 0's TP group only) and
        streams them into the safetensors file ``path`` on global rank 0. ``sources``:
        ``[(key prefix, of(name, param) -> tensor)]``, written one after the other; ``digest``
        (rank 0): fed each tensor as it is written."""
        if self.dp_rank != 0:
            return
        names = convert.hf_layout(self.model, self.spec, self.tp)
        layout = [(prefix + n, shape, dtype) for prefix, _ in sources for n, shape, dtype in names]
        out = files.run(stream.Writer, path, layout, {"format": "pt"}, digest) if self.rank == 0 else None
        for prefix, of in sources:
            for n, t in convert.gather_hf(self.model, self.spec, self.tp_group, of):
                if out is not None:
                    files.run(out.put, prefix + n, t)
        if out is not None:
            files.run(out.close)
            out.abort()  # closes the file where a failure skipped close()

    def _write_index(self, out):
        layout = convert.hf_layout(self.model, self.spec, self.tp)
        size = sum(torch.Size(shape).numel() * dtype.itemsize for _, shape, dtype in layout)
        index = {"metadata": {"total_size": size}, "weight_map": {n: "model.safetensors" for n, _, _ in layout}}
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)

    def _write_config(self, out):
        with open(os.path.join(self.cfg["model_path"], "config.json")) as f:
            raw = json.load(f)
        name = str(self.dtype).removeprefix("torch.")
        keys = [k for k in ("dtype", "torch_dtype") if k in raw] or ["torch_dtype"]
        for k in keys:
            raw[k] = name
        with open(os.path.join(out, "config.json"), "w") as f:
            json.dump(raw, f, indent=2)

    def _write_checkpoint(self, out, with_optim, files, digest=None):
        """The weights (``digest`` fed each), with ``with_optim`` the AdamW moments and the
        index naming the weights' file, the config and the state file, into ``out``."""
        if self.rank == 0:
            files.run(os.makedirs, out, exist_ok=True)
        self._write_tensors(files, os.path.join(out, "model.safetensors"), [("", lambda _n, p: p.detach())], digest)
        if with_optim and self._has_moments():
            moments = [(key + ".", lambda _n, p, key=key: self.optim.state[p][key]) for key in ("exp_avg", "exp_avg_sq")]
            self._write_tensors(files, os.path.join(out, "optimizer.safetensors"), moments)
            if self.rank == 0:
                # vLLM loads every *.safetensors of a directory without an index: this one
                # names the weights' file, so the moments beside it are left alone.
                files.run(self._write_index, out)
        if self.rank == 0:
            files.run(self._write_config, out)
            files.run(write_state, out, self._state())
        files.check()

    def op_save_checkpoint(self, dir):
        self._ready("save_checkpoint")
        self._write_checkpoint(dir, with_optim=True, files=_RankZeroFiles())
        if self.rank == 0:
            return {"dir": dir, "weight_version": self.version, "bytes": dir_bytes(dir)}

    def op_load_checkpoint(self, dir):
        self._ready("load_checkpoint")
        reader = convert.HfReader(dir)
        convert.load_shards(self.model, reader.get, self.spec, self.tp, self.tp_rank, what=f"load_checkpoint {dir}")
        if os.path.exists(os.path.join(dir, "optimizer.safetensors")):
            moments = convert.HfReader(dir, base="optimizer")
            step = int((read_state(dir) or {}).get("adam_step", 0))
            state = {}
            with torch.no_grad():
                for name, p in self.model.named_parameters():
                    kind, names = convert.rule(name)
                    st = {"step": torch.tensor(float(step), dtype=torch.float32)}
                    for key in ("exp_avg", "exp_avg_sq"):
                        shard = convert.to_shard(kind, [moments.get(f"{key}.{n}") for n in names], self.spec, self.tp, self.tp_rank)
                        if tuple(shard.shape) != tuple(p.shape):
                            raise ValueError(f"load_checkpoint {dir}: {key}.{names[0]} does not fit {name} {tuple(p.shape)}")
                        st[key] = shard.to(device=p.device, dtype=p.dtype, copy=True)
                    state[p] = st
            self.optim.state.clear()
            self.optim.state.update(state)
        v = saved_version(dir)
        if v is not None:
            self.version = v
        if self.rank == 0:
            return {"dir": dir, "weight_version": self.version, "bytes": dir_bytes(dir)}

    def op_export(self, kind):
        self._ready("export_weight_update")
        if kind != "checkpoint_dir":
            raise ValueError(
                f"export_weight_update({kind}): this trainer fine-tunes all weights and exports checkpoint_dir updates (no LoRA on Megatron layers)"
            )
        v = self.version
        out = Version(self.cfg["run_dir"], "weights", v)
        files = _RankZeroFiles()
        digest = Digest(self.opts.get("digest", True)) if self.rank == 0 else None
        if self.rank == 0:
            files.run(out.prepare)
        self._write_checkpoint(out.stage, with_optim=False, files=files, digest=digest)
        if self.rank != 0:
            return None
        out.publish(durable=True)
        return {
            "kind": kind,
            "dir": out.final,
            "name": f"{self.NAME}-v{v}",
            "version": v,
            "bytes": dir_bytes(out.final),
            "digest": digest.value(),
        }


class _RankZeroFiles:
    """Rank 0's file writes between collectives: a failure (disk full, permissions) must not
    make rank 0 leave the gathers the other ranks are in, so the first error is kept, later
    writes are skipped, and ``check`` raises it after the last collective."""

    def __init__(self):
        self.error = None

    def run(self, fn, *args, **kwargs):
        if self.error is None:
            try:
                return fn(*args, **kwargs)
            except Exception as e:  # re-raised by check()
                self.error = e
        return None

    def check(self):
        if self.error is not None:
            raise self.error
