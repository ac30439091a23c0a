"""One rank of the FSDP2 trainer: the operations the plugin drives, run on every rank.

The model is a Hugging Face causal LM, optionally wrapped by PEFT LoRA, sharded with
``fully_shard`` per decoder layer and then at the root. Every operation is called on every
rank in the same order (rank 0 received it and broadcast it); only rank 0's return value
travels back. A training batch is split over the ranks by sequence (``i % world == rank``);
a rank with no sequence still runs a forward/backward on a dummy so the collectives match.
"""

import copy
import os

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from tandem_torchrun.batch import Padded
from tandem_torchrun.export import Digest, Version
from tandem_torchrun.files import dir_bytes, saved_version, write_state
from tandem_torchrun.loss import normaliser, policy_terms
from tandem_torchrun.state import TrainerState


def _fully_shard():
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch < 2.6
        from torch.distributed._composable.fsdp import fully_shard
    return fully_shard


def _full(t):
    """The full tensor of a (possibly sharded) parameter, on every rank."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _decoder_layers(model):
    """The decoder layers (the ``ModuleList`` named ``...layers``) to shard one by one."""
    for name, module in model.named_modules():
        if name.endswith("layers") and isinstance(module, torch.nn.ModuleList):
            return list(module)
    return []


class FsdpTrainer(TrainerState):
    """State of one rank; ``op_*`` methods are the operations of the control channel."""

    NAME = "fsdp"

    def __init__(self, cfg, rank, world):
        super().__init__(cfg, rank, world)
        self.lora = self.opts.get("lora")

    # ---- helpers -------------------------------------------------------------------------

    def _trainable(self):
        """Trainable parameters, all sharded (the root keeps its parameters unsharded after a
        forward; resharding first makes every one a DTensor shard again)."""
        if hasattr(self.model, "reshard"):
            self.model.reshard()
        return [p for p in self.model.parameters() if p.requires_grad]

    def _snapshot_params(self):
        return self._trainable()

    @staticmethod
    def _backup(obj):
        # Parameters are DTensor shards: deepcopy keeps their placement.
        return copy.deepcopy(obj)

    def _local(self, seqs):
        return [s for i, s in enumerate(seqs) if i % self.world == self.rank]

    def _logprobs(self, pad):
        logits = self.model(input_ids=pad.ids, use_cache=False).logits.float()
        lp = torch.log_softmax(logits[:, :-1], dim=-1)
        return lp.gather(-1, pad.ids[:, 1:].unsqueeze(-1)).squeeze(-1)

    def _gather_rows(self, local_rows, n):
        """Per-rank completion rows → the batch's rows in order (rank 0; others get None)."""
        parts = [None] * self.world
        dist.all_gather_object(parts, local_rows)
        if self.rank != 0:
            return None
        out = [None] * n
        for r, rows in enumerate(parts):
            for j, row in enumerate(rows):
                out[r + j * self.world] = row
        return out

    # ---- operations ----------------------------------------------------------------------

    def op_init(self):
        if self.model is not None:
            raise RuntimeError("trainer `fsdp` is already initialised")
        from transformers import AutoModelForCausalLM

        path = self.cfg["model_path"]
        dtype = getattr(torch, self.opts.get("dtype", "float32"))
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager")
        total = sum(p.numel() for p in model.parameters())
        if self.lora:
            from peft import LoraConfig, get_peft_model

            # The same seed on every rank: the shards of A come from one initialisation.
            torch.manual_seed(int(self.lora.get("seed", 0)))
            targets = self.lora.get("targets") or [
                "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"
            ]
            lcfg = LoraConfig(
                r=int(self.lora["rank"]),
                lora_alpha=float(self.lora["alpha"]),
                target_modules=targets,
                lora_dropout=0.0,
                bias="none",
            )
            model = get_peft_model(model, lcfg)
        model.to(self.device)
        fully_shard = _fully_shard()
        for layer in _decoder_layers(model):
            fully_shard(layer)
        fully_shard(model)
        self.model = model
        params = self._trainable()
        self.optim = torch.optim.AdamW(
            params,
            lr=1e-3,
            betas=(self.opts.get("beta1", 0.9), self.opts.get("beta2", 0.999)),
            eps=self.opts.get("eps", 1e-8),
            weight_decay=self.opts.get("weight_decay", 0.0),
        )
        trainable = sum(_full_numel(p) for p in params)
        v = saved_version(path)
        self.version = max(self.version, v or 0)
        return {
            "trainable_params": int(trainable),
            "total_params": int(total + (trainable if self.lora else 0)),
            "weight_version": self.version,
        }

    def op_compute_logprobs(self, batch, snapshot=None):
        self._ready("compute_logprobs")
        if snapshot is not None:
            return self._with_snapshot(snapshot, lambda: self.op_compute_logprobs(batch))
        seqs = batch["sequences"]
        if not seqs:
            raise ValueError("train batch has no sequences")
        local = self._local(seqs)
        vocab = self.model.config.vocab_size
        pad = Padded(local, vocab, self.device)
        with torch.no_grad():
            lp = self._logprobs(pad)
        return self._gather_rows(pad.completions(lp), len(seqs))

    def op_train_step(self, batch):
        self._ready("train_step")
        loss_cfg = batch["loss"]
        lr = float(loss_cfg["learning_rate"])
        if not lr > 0.0 or lr != lr or lr == float("inf"):
            raise ValueError(f"train_step: learning_rate must be > 0 (got {lr})")
        seqs = batch["sequences"]
        if not seqs:
            raise ValueError("train batch has no sequences")
        for i, s in enumerate(seqs):
            p, n = int(s["prompt_len"]), len(s["tokens"])
            if not 1 <= p <= n:
                raise ValueError(f"sequence {i}: prompt_len {p} must be in 1..={n}")
        norm = normaliser(seqs, loss_cfg)
        local = self._local(seqs)
        pad = Padded(local, self.model.config.vocab_size, self.device)
        self.model.train()
        lp = self._logprobs(pad)
        adv = torch.tensor(
            [[float(s["advantage"])] for s in local] or [[0.0]], dtype=lp.dtype, device=lp.device
        )
        old = pad.aligned(local, "old_logprobs")
        ref = pad.aligned(local, "ref_logprobs")
        if loss_cfg["kind"] != "sft" and loss_cfg["kl_coef"] > 0 and ref is None and not pad.dummy:
            raise ValueError("train_step: kl_coef > 0 needs ref_logprobs on every sequence")
        weighted, sums = policy_terms(lp, pad.mask, adv, old, ref, loss_cfg)
        # FSDP2 averages gradients over ranks: scale so the result is Σ over all ranks / Z.
        local_loss = weighted.sum() / norm
        (local_loss * self.world).backward()
        dist.all_reduce(sums)
        params = self._trainable()
        clip = float(loss_cfg.get("grad_clip", 0.0))
        total_norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else float("inf"))
        grad_norm = float(_full(total_norm))
        return self._finish_step(grad_norm, lr, sums, norm)

    # ---- checkpoints and exports ---------------------------------------------------------

    def _write_model(self, out, digest=None):
        """Gathers the model; rank 0 writes a HF checkpoint (or PEFT adapter) into ``out`` and
        feeds ``digest`` (a ``Digest``) the tensors it writes."""
        from safetensors.torch import save_file

        if self.lora:
            from peft import get_peft_model_state_dict

            sd = {n: _full(p.detach()).cpu() for n, p in self.model.named_parameters() if p.requires_grad}
            if self.rank == 0:
                ad = {k: v.contiguous() for k, v in get_peft_model_state_dict(self.model, state_dict=sd).items()}
                os.makedirs(out, exist_ok=True)
                save_file(ad, os.path.join(out, "adapter_model.safetensors"), metadata={"format": "pt"})
                self.model.peft_config["default"].save_pretrained(out)
                if digest is not None:
                    digest.add_all(ad)
            return
        sd = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.rank == 0:
            if getattr(self.model.config, "tie_word_embeddings", False):
                sd.pop("lm_head.weight", None)
            os.makedirs(out, exist_ok=True)
            sd = {k: v.contiguous() for k, v in sd.items()}
            save_file(sd, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
            self.model.config.save_pretrained(out)
            if digest is not None:
                digest.add_all(sd)

    def _write_state(self, out):
        if self.rank == 0:
            write_state(out, self._state())

    def op_save_checkpoint(self, dir):
        self._ready("save_checkpoint")
        self._write_model(dir)
        osd = get_optimizer_state_dict(
            self.model, self.optim, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
        if self.rank == 0:
            torch.save(osd, os.path.join(dir, "optimizer.pt"))
        self._write_state(dir)
        if self.rank == 0:
            return {"dir": dir, "weight_version": self.version, "bytes": dir_bytes(dir)}

    def op_load_checkpoint(self, dir):
        self._ready("load_checkpoint")
        from safetensors.torch import load_file

        if self.lora:
            path = os.path.join(dir, "adapter_model.safetensors")
            if not os.path.exists(path):
                raise FileNotFoundError(f"load_checkpoint {dir}: no adapter_model.safetensors (LoRA mode)")
            saved = load_file(path)
            self._load_adapter(saved, dir)
        else:
            path = os.path.join(dir, "model.safetensors")
            if not os.path.exists(path):
                raise FileNotFoundError(f"load_checkpoint {dir}: no model.safetensors")
            sd = load_file(path)
            if getattr(self.model.config, "tie_word_embeddings", False) and "lm_head.weight" not in sd:
                sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
            set_model_state_dict(self.model, sd, options=StateDictOptions(full_state_dict=True))
        opt_path = os.path.join(dir, "optimizer.pt")
        if os.path.exists(opt_path):
            osd = torch.load(opt_path, map_location="cpu", weights_only=False)
            set_optimizer_state_dict(
                self.model, self.optim, optim_state_dict=osd, options=StateDictOptions(full_state_dict=True)
            )
        v = saved_version(dir)
        if v is not None:
            self.version = v
        if self.rank == 0:
            return {"dir": dir, "weight_version": self.version, "bytes": dir_bytes(dir)}

    def _load_adapter(self, saved, dir):
        from torch.distributed.tensor import distribute_tensor

        named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        missing = [n for n, _ in named if n.replace(".default", "") not in saved]
        if missing:
            raise ValueError(f"load_checkpoint {dir}: adapter lacks {missing[0]} (r/targets differ from the trained adapter?)")
        with torch.no_grad():
            for n, p in named:
                t = saved[n.replace(".default", "")].to(p.dtype)
                if tuple(t.shape) != tuple(p.shape):
                    raise ValueError(f"load_checkpoint {dir}: {n} has shape {tuple(t.shape)}, expected {tuple(p.shape)}")
                if hasattr(p, "device_mesh"):
                    t = distribute_tensor(t.to(self.device), p.device_mesh, p.placements)
                p.copy_(t)

    def op_export(self, kind):
        self._ready("export_weight_update")
        want = "adapter" if self.lora else "checkpoint_dir"
        if kind != want:
            what = "trains a LoRA adapter and" if self.lora else "fine-tunes all weights and"
            raise ValueError(f"export_weight_update({kind}): this trainer {what} exports {want} updates")
        v = self.version
        out = Version(self.cfg["run_dir"], "adapters" if self.lora else "weights", v)
        if self.rank == 0:
            out.prepare()
        digest = Digest(self.opts.get("digest", True))
        self._write_model(out.stage, digest)
        self._write_state(out.stage)
        if self.rank != 0:
            return None
        # A checkpoint is durable; an adapter is re-exportable and skips the fsyncs.
        out.publish(durable=not self.lora)
        return {
            "kind": want,
            "dir": out.final,
            "name": f"fsdp-v{v}",
            "version": v,
            "bytes": dir_bytes(out.final),
            "digest": digest.value(),
        }


def _full_numel(p):
    shape = p.shape  # a DTensor reports its global shape
    n = 1
    for d in shape:
        n *= int(d)
    return n
