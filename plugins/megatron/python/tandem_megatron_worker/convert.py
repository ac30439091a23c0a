"""Hugging Face Llama / Qwen2 checkpoints <-> Megatron-Core tensor-parallel shards.

A converter of our own rather than mbridge: no extra dependency, and on CPU mbridge needs a
subclass (its name map knows only TransformerEngine's fused-norm names) plus a private provider
call (its ``get_model`` calls ``.cuda()``), while the whole mapping is the table below.

Megatron parameter (per TP rank ``r`` of ``tp``)      HF tensor(s)                       kind
``embedding.word_embeddings.weight``                 ``model.embed_tokens.weight``      rows split (vocab-parallel)
``output_layer.weight`` (absent when tied)           ``lm_head.weight``                 rows split (vocab-parallel)
``decoder.final_layernorm.weight``                   ``model.norm.weight``              replicated
``decoder.layers.i.input_layernorm.weight``          ``...input_layernorm.weight``      replicated
``decoder.layers.i.pre_mlp_layernorm.weight``        ``...post_attention_layernorm...`` replicated
``decoder.layers.i.self_attention.linear_qkv.*``     ``q_proj``, ``k_proj``, ``v_proj``  grouped per KV group
``decoder.layers.i.self_attention.linear_proj...``   ``o_proj.weight``                  columns split
``decoder.layers.i.mlp.linear_fc1.weight``           ``gate_proj``, ``up_proj``          per rank [gate_r; up_r]
``decoder.layers.i.mlp.linear_fc2.weight``           ``down_proj.weight``               columns split

QKV (weight rows, and the Qwen2 bias the same way): per KV group ``[q x nq/nkv, k, v]``, each a
``head_dim`` block, then split into ``tp`` row chunks, so each rank holds whole groups. The
vocabulary must divide by ``tp`` (no padding: padded rows would have to be masked out of the
softmax). Tied embeddings (``tie_word_embeddings``) use Megatron's shared output weight and
export no ``lm_head.weight``, as HF writes them.
"""

import json
import os
import re

import torch

ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM")
TIED_HEAD = "lm_head.weight"


class Spec:
    """The dimensions of an HF Llama/Qwen2 config that the conversion and the model need."""

    def __init__(self, model_dir, tp):
        from transformers import AutoConfig

        path = os.path.join(model_dir, "config.json")
        if not os.path.exists(path):
            raise FileNotFoundError(f"model {model_dir}: no config.json (expected a Hugging Face checkpoint directory)")
        with open(path) as f:
            raw = json.load(f)
        archs = raw.get("architectures") or []
        arch = archs[0] if archs else raw.get("model_type")
        if arch not in ARCHITECTURES:
            raise ValueError(
                f"model {model_dir}: architecture {arch!r} is not supported by the megatron trainer "
                f"(supported: {', '.join(ARCHITECTURES)}); use the fsdp trainer for other models"
            )
        c = AutoConfig.from_pretrained(model_dir)
        self.model_dir = model_dir
        self.arch = arch
        self.vocab = int(c.vocab_size)
        self.hidden = int(c.hidden_size)
        self.ffn = int(c.intermediate_size)
        self.layers = int(c.num_hidden_layers)
        self.heads = int(c.num_attention_heads)
        self.groups = int(getattr(c, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(c, "head_dim", None) or self.hidden // self.heads)
        self.eps = float(c.rms_norm_eps)
        self.tied = bool(getattr(c, "tie_word_embeddings", False))
        self.qkv_bias = arch == "Qwen2ForCausalLM"
        self.max_positions = int(getattr(c, "max_position_embeddings", 0) or 0)
        self.rope_theta = _rope_theta(c, model_dir)
        _refuse_unsupported(c, raw, arch, model_dir)
        self._check_tp(tp)

    def _check_tp(self, tp):
        where = f"model {self.model_dir}"
        if self.heads % self.groups:
            raise ValueError(f"{where}: {self.heads} attention heads do not divide into {self.groups} KV groups")
        for what, n in (
            ("attention heads (num_attention_heads)", self.heads),
            ("KV groups (num_key_value_heads)", self.groups),
            ("ffn size (intermediate_size)", self.ffn),
            ("vocabulary (vocab_size)", self.vocab),
        ):
            if n % tp:
                raise ValueError(f"{where}: {what} = {n} is not divisible by tp = {tp}; choose a tp that divides it")

    @property
    def qkv_rows(self):
        return (self.heads + 2 * self.groups) * self.head_dim


def _rope_theta(c, model_dir):
    params = getattr(c, "rope_parameters", None)  # transformers >= 5
    scaling = getattr(c, "rope_scaling", None)  # transformers 4
    if isinstance(params, dict):
        kind = params.get("rope_type", params.get("type", "default"))
        if kind not in (None, "default"):
            raise ValueError(f"model {model_dir}: rope_type {kind!r} is not supported (only unscaled RoPE); use the fsdp trainer")
        theta = params.get("rope_theta", getattr(c, "rope_theta", None))
    else:
        if scaling:
            kind = scaling.get("rope_type", scaling.get("type"))
            if kind not in (None, "default"):
                raise ValueError(f"model {model_dir}: rope_scaling {kind!r} is not supported (only unscaled RoPE); use the fsdp trainer")
        theta = getattr(c, "rope_theta", None)
    return float(theta if theta is not None else 10000.0)


def _refuse_unsupported(c, raw, arch, model_dir):
    where = f"model {model_dir}"
    act = getattr(c, "hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"{where}: hidden_act {act!r} is not supported (SwiGLU with silu only)")
    if arch == "LlamaForCausalLM":
        # HF puts attention_bias on o_proj too; Megatron has no bias switch for linear_proj alone.
        if getattr(c, "attention_bias", False):
            raise ValueError(f"{where}: attention_bias = true (q/k/v/o biases) is not supported for Llama; use the fsdp trainer")
        if getattr(c, "mlp_bias", False):
            raise ValueError(f"{where}: mlp_bias = true is not supported; use the fsdp trainer")
        if int(raw.get("pretraining_tp", 1) or 1) != 1:
            raise ValueError(f"{where}: pretraining_tp = {raw['pretraining_tp']} is not supported (must be 1)")
    layer_types = getattr(c, "layer_types", None)
    if layer_types is not None:
        sliding = "sliding_attention" in layer_types
    else:  # transformers 4: Qwen2 slides from layer max_window_layers on
        sliding = bool(getattr(c, "use_sliding_window", False) and getattr(c, "sliding_window", None)) and int(
            getattr(c, "max_window_layers", 0) or 0
        ) < int(c.num_hidden_layers)
    if sliding:
        raise ValueError(f"{where}: sliding-window attention is active (use_sliding_window / layer_types); only full attention is supported")
    drop = float(getattr(c, "attention_dropout", 0.0) or 0.0)
    if drop:
        raise ValueError(f"{where}: attention_dropout = {drop} is not supported (the trainer runs without dropout); set it to 0.0")


def build_model(spec, tp, dtype, seq_length):
    """The Megatron ``GPTModel`` for ``spec`` (local layer spec, every fusion off, CPU
    initialisation without random init: the weights come from the checkpoint)."""
    import torch.nn.functional as F
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    config = TransformerConfig(
        num_layers=spec.layers,
        hidden_size=spec.hidden,
        ffn_hidden_size=spec.ffn,
        num_attention_heads=spec.heads,
        num_query_groups=spec.groups,
        kv_channels=spec.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=spec.eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=spec.qkv_bias,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=tp,
        sequence_parallel=False,
        use_cpu_initialization=True,
        perform_initialization=False,
        params_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        cross_entropy_loss_fusion=False,
        attention_softmax_in_fp32=True,
    )
    model = GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
        vocab_size=spec.vocab,
        max_sequence_length=seq_length,
        parallel_output=True,
        share_embeddings_and_output_weights=spec.tied,
        position_embedding_type="rope",
        rotary_base=spec.rope_theta,
    )
    # Megatron marks a weight as TP-sharded only inside its random init (tensor_parallel/
    # layers.py:244-266, 855-885), which perform_initialization=False skips; the gradient
    # norm needs the marks (param_is_not_tensor_parallel_duplicate), so set them from the table.
    for name, p in model.named_parameters():
        if not hasattr(p, "tensor_model_parallel"):
            kind, _ = rule(name)
            p.tensor_model_parallel = kind != "copy"
            p.partition_dim = _PARTITION_DIM.get(kind, -1)
            p.partition_stride = 1
    return model


# ---- the name table ----------------------------------------------------------------------

_PARTITION_DIM = {"rows": 0, "qkv": 0, "fc1": 0, "cols": 1}
_LAYER = re.compile(r"decoder\.layers\.(\d+)\.(.+)")
_IN_LAYER = {
    "input_layernorm.weight": ("copy", ["input_layernorm.weight"]),
    "pre_mlp_layernorm.weight": ("copy", ["post_attention_layernorm.weight"]),
    "self_attention.linear_qkv.weight": ("qkv", ["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"]),
    "self_attention.linear_qkv.bias": ("qkv", ["self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"]),
    "self_attention.linear_proj.weight": ("cols", ["self_attn.o_proj.weight"]),
    "mlp.linear_fc1.weight": ("fc1", ["mlp.gate_proj.weight", "mlp.up_proj.weight"]),
    "mlp.linear_fc2.weight": ("cols", ["mlp.down_proj.weight"]),
}
_TOP = {
    "embedding.word_embeddings.weight": ("rows", ["model.embed_tokens.weight"]),
    "output_layer.weight": ("rows", [TIED_HEAD]),
    "decoder.final_layernorm.weight": ("copy", ["model.norm.weight"]),
}


def rule(name):
    """``(kind, hf_names)`` of a Megatron parameter name."""
    if name in _TOP:
        return _TOP[name]
    m = _LAYER.fullmatch(name)
    if m and m.group(2) in _IN_LAYER:
        kind, names = _IN_LAYER[m.group(2)]
        return kind, [f"model.layers.{m.group(1)}.{n}" for n in names]
    raise KeyError(f"no HF name for Megatron parameter {name}")


def to_shard(kind, full, spec, tp, r):
    """Rank ``r``'s shard of the Megatron parameter made from the HF tensors ``full``."""
    if kind == "copy":
        return full[0]
    if kind == "rows":
        return full[0].chunk(tp, 0)[r]
    if kind == "cols":
        return full[0].chunk(tp, 1)[r]
    if kind == "fc1":
        gate, up = full
        return torch.cat([gate.chunk(tp, 0)[r], up.chunk(tp, 0)[r]], 0)
    if kind == "qkv":
        q, k, v = full
        g, d, rest = spec.groups, spec.head_dim, tuple(q.shape[1:])
        fused = torch.cat(
            [q.reshape(g, spec.heads // g, d, *rest), k.reshape(g, 1, d, *rest), v.reshape(g, 1, d, *rest)], 1
        )
        return fused.reshape(spec.qkv_rows, *rest).chunk(tp, 0)[r]
    raise KeyError(kind)


def from_shards(kind, shards, spec):
    """The HF tensors (in ``rule`` order) of a Megatron parameter from its ``tp`` shards."""
    if kind == "copy":
        return [shards[0]]
    if kind == "rows":
        return [torch.cat(shards, 0)]
    if kind == "cols":
        return [torch.cat(shards, 1)]
    if kind == "fc1":
        halves = [s.chunk(2, 0) for s in shards]
        return [torch.cat([h[0] for h in halves], 0), torch.cat([h[1] for h in halves], 0)]
    if kind == "qkv":
        full = torch.cat(shards, 0)
        g, d, rest = spec.groups, spec.head_dim, tuple(full.shape[1:])
        per = spec.heads // g
        grouped = full.reshape(g, per + 2, d, *rest)
        q = grouped[:, :per].reshape(spec.heads * d, *rest)
        k = grouped[:, per].reshape(g * d, *rest)
        v = grouped[:, per + 1].reshape(g * d, *rest)
        return [q.contiguous(), k.contiguous(), v.contiguous()]
    raise KeyError(kind)


# ---- reading an HF checkpoint and loading / exporting shards -----------------------------


class HfReader:
    """Tensors of a checkpoint directory by name (one ``<base>.safetensors`` or the shards
    listed in ``<base>.safetensors.index.json``), read one at a time."""

    def __init__(self, model_dir, base="model"):
        from safetensors import safe_open

        index = os.path.join(model_dir, f"{base}.safetensors.index.json")
        single = os.path.join(model_dir, f"{base}.safetensors")
        if os.path.exists(index):
            with open(index) as f:
                files = json.load(f)["weight_map"]
        elif os.path.exists(single):
            files = None
        else:
            raise FileNotFoundError(f"{model_dir}: no {base}.safetensors (nor {base}.safetensors.index.json)")
        self.dir = model_dir
        self.handles = {}
        self.where = {}
        for fname in sorted(set(files.values())) if files else [f"{base}.safetensors"]:
            h = safe_open(os.path.join(model_dir, fname), framework="pt")
            self.handles[fname] = h
            for k in h.keys():
                self.where[k] = fname

    def keys(self):
        return set(self.where)

    def get(self, name):
        if name not in self.where:
            raise ValueError(f"{self.dir}: checkpoint has no tensor {name}")
        return self.handles[self.where[name]].get_tensor(name)


def load_shards(model, read, spec, tp, r, what="weights"):
    """Copies rank ``r``'s shard of every parameter from ``read(hf_name)`` into ``model``."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            kind, names = rule(name)
            shard = to_shard(kind, [read(n) for n in names], spec, tp, r)
            if tuple(shard.shape) != tuple(p.shape):
                raise ValueError(f"{what}: {names[0]} gives a {tuple(shard.shape)} shard for {name}, expected {tuple(p.shape)} (config.json and tensors disagree?)")
            p.copy_(shard)


def gather_hf(model, spec, tp_group, of):
    """Yields ``(hf_name, full_tensor_on_cpu)`` for every HF tensor, one Megatron parameter at
    a time: the shards of ``of(name, param)`` (the weight, or an optimizer moment) are gathered onto TP rank 0 (``dist.gather``),
    which yields the tensors; the other TP ranks take part and yield nothing. At most one
    parameter's full tensor exists at a time besides what the caller keeps."""
    import torch.distributed as dist

    tp = dist.get_world_size(tp_group)
    me = dist.get_rank(tp_group)
    dst = dist.get_global_rank(tp_group, 0)
    for name, p in model.named_parameters():
        kind, names = rule(name)
        t = of(name, p).contiguous()
        if kind == "copy" or tp == 1:
            shards = [t]
        else:
            shards = [torch.empty_like(t) for _ in range(tp)] if me == 0 else None
            dist.gather(t, shards, dst=dst, group=tp_group)
        if me == 0:
            for n, full in zip(names, from_shards(kind, shards, spec)):
                yield n, full.cpu()


def hf_layout(model, spec, tp):
    """``[(hf_name, shape, dtype)]`` in the order ``gather_hf`` yields them (computed on the
    meta device, nothing allocated)."""
    out = []
    for name, p in model.named_parameters():
        kind, names = rule(name)
        shard = torch.empty(p.shape, dtype=p.dtype, device="meta")
        shards = [shard] if kind == "copy" else [shard] * tp
        out += [(n, tuple(t.shape), t.dtype) for n, t in zip(names, from_shards(kind, shards, spec))]
    return out
