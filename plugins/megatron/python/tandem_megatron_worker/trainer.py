"""One rank of the Megatron-Core trainer: the operations the plugin drives, run on every rank.

The model is a Megatron ``GPTModel`` (local layer spec) built from an HF Llama/Qwen2 checkpoint
and split over ``tp`` tensor-parallel ranks; ``dp`` such groups hold replicas (world = tp x dp,
Megatron's rank order: the ranks of one TP group are consecutive). A batch is split over the DP
groups by sequence (``i % dp == dp_rank``); the TP ranks of a group see the same sequences and
run them in micro-batches of ``micro_batch_size``. Gradients are summed over the DP group after
the backward; the optimizer is ``torch.optim.AdamW`` over each rank's shards (Megatron's own
optimizers allocate on CUDA). Every operation runs on every rank in the same order; global rank
0's return value is the reply. Inputs are checked on the whole batch before any collective, so
a bad input fails on every rank alike instead of leaving the others waiting in a collective.
"""


import torch
import torch.distributed as dist

from tandem_torchrun.batch import Padded
from tandem_torchrun.files import saved_version
from tandem_torchrun.loss import normaliser, policy_terms
from tandem_torchrun.state import TrainerState

from . import convert
from .checkpoint import CheckpointOps

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
BUCKET = 1 << 24  # elements per gradient all-reduce


def _cpu_copy(obj):
    """A deep copy whose tensors are detached CPU copies (snapshots live in host memory)."""
    if torch.is_tensor(obj):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _cpu_copy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cpu_copy(v) for v in obj)
    return obj


class MegatronTrainer(TrainerState, CheckpointOps):
    """State of one rank; ``op_*`` methods are the operations of the control channel."""

    NAME = "megatron"

    def __init__(self, cfg, rank, world):
        super().__init__(cfg, rank, world)
        self.spec = None

    # ---- options and groups --------------------------------------------------------------

    def _options(self):
        o = self.opts
        tp = int(o.get("tp", 1))
        dp = int(o.get("dp", max(1, self.world // max(tp, 1))))
        if tp < 1 or dp < 1 or tp * dp != self.world:
            raise ValueError(f"options tp = {tp} x dp = {dp} need {tp * dp} ranks but the job has {self.world}; start tp x dp ranks")
        mbs = int(o.get("micro_batch_size", 1))
        if mbs < 1:
            raise ValueError(f"options micro_batch_size = {mbs} must be >= 1")
        name = o.get("dtype", "float32")
        if name not in DTYPES:
            raise ValueError(f"options dtype = {name!r} is not supported (float32 or bfloat16; float16 would need loss scaling)")
        self.tp, self.dp, self.mbs, self.dtype = tp, dp, mbs, DTYPES[name]

    def _init_groups(self):
        from megatron.core import parallel_state as ps

        if not ps.model_parallel_is_initialized():
            ps.initialize_model_parallel(tensor_model_parallel_size=self.tp)
        self.tp_group = ps.get_tensor_model_parallel_group()
        self.dp_group = ps.get_data_parallel_group()
        self.tp_rank = ps.get_tensor_model_parallel_rank()
        self.dp_rank = ps.get_data_parallel_rank()

    # ---- helpers -------------------------------------------------------------------------

    def _check_batch(self, seqs, fields=()):
        """Every sequence's shape, on every rank, before any collective runs."""
        if not seqs:
            raise ValueError("train batch has no sequences")
        vocab = self.spec.vocab
        for i, s in enumerate(seqs):
            toks, p = s["tokens"], int(s["prompt_len"])
            n = len(toks)
            if not 1 <= p <= n:
                raise ValueError(f"sequence {i}: prompt_len {p} must be in 1..={n} (the first token has no logprob)")
            if n > self.seq_length:
                raise ValueError(f"sequence {i}: {n} tokens exceed the trainer option seq_length = {self.seq_length}; raise it or shorten the sequence")
            bad = [x for x in toks if not 0 <= x < vocab]
            if bad:
                raise ValueError(f"sequence {i}: token id {bad[0]} is out of range for vocab_size {vocab}")
        for field in fields:
            given = [i for i, s in enumerate(seqs) if len(s.get(field) or []) > 0]
            for i in given:
                s = seqs[i]
                want = len(s["tokens"]) - int(s["prompt_len"])
                if len(s[field]) != want:
                    raise ValueError(f"sequence {i}: {field} has {len(s[field])} entries for {want} completion tokens")
            have = set(given)
            missing = [i for i, s in enumerate(seqs) if i not in have and len(s["tokens"]) > int(s["prompt_len"])]
            if given and missing:
                raise ValueError(f"sequence {missing[0]}: {field} is missing while other sequences carry it")

    def _micro_batches(self, seqs):
        local = [s for i, s in enumerate(seqs) if i % self.dp == self.dp_rank]
        return [local[j : j + self.mbs] for j in range(0, len(local), self.mbs)]

    def _logprobs(self, pad):
        """Log-probs ``[b, t-1]`` (float32) of each next token: vocab-parallel cross entropy on
        the TP-sharded logits, never gathering the vocabulary."""
        from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

        ids = pad.ids
        b, t = ids.shape
        pos = torch.arange(t, device=ids.device).unsqueeze(0).expand(b, t)
        # An explicit mask (True = masked): megatron's default one is built on "cuda".
        mask = torch.ones((1, 1, t, t), dtype=torch.bool, device=ids.device).triu(1)
        logits = self.model(ids, pos, mask)  # [b, t, vocab/tp]
        # The last column's target is a placeholder; its value is dropped below.
        target = torch.cat([ids[:, 1:], ids[:, :1]], 1)
        ce = vocab_parallel_cross_entropy(logits.float(), target)
        return -ce[:, :-1]

    def _gather_rows(self, local_rows, n):
        """Per-DP-rank completion rows → the batch's rows in order (global rank 0)."""
        parts = [None] * self.dp
        dist.all_gather_object(parts, local_rows, group=self.dp_group)
        if self.rank != 0:
            return None
        out = [None] * n
        for r, rows in enumerate(parts):
            for j, row in enumerate(rows):
                out[r + j * self.dp] = row
        return out

    def _params(self):
        return list(self.model.parameters())

    def _snapshot_params(self):
        return self._params()

    @staticmethod
    def _backup(obj):
        return _cpu_copy(obj)

    def _extra_metrics(self):
        return dict(super()._extra_metrics(), tp=float(self.tp), dp=float(self.dp))

    # ---- operations ----------------------------------------------------------------------

    def op_init(self):
        if self.model is not None:
            raise RuntimeError(f"trainer `{self.NAME}` is already initialised")
        self._options()
        path = self.cfg["model_path"]
        self.spec = convert.Spec(path, self.tp)
        self.seq_length = int(self.opts.get("seq_length") or self.spec.max_positions or 4096)
        if self.seq_length < 2:
            raise ValueError(f"options seq_length = {self.seq_length} must be >= 2")
        self._init_groups()
        seed = int(self.opts.get("seed", 0))
        if self.device.type == "cpu":
            from . import cpu_patch

            cpu_patch.apply(self.device)
            cpu_patch.seed(seed)
        else:
            from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

            model_parallel_cuda_manual_seed(seed)
        model = convert.build_model(self.spec, self.tp, self.dtype, self.seq_length)
        reader = convert.HfReader(path)
        convert.load_shards(model, reader.get, self.spec, self.tp, self.tp_rank, what=f"model {path}")
        del reader
        self.model = model.to(self.device)
        self.optim = torch.optim.AdamW(
            self._params(),
            lr=1e-3,
            betas=(float(self.opts.get("beta1", 0.9)), float(self.opts.get("beta2", 0.999))),
            eps=float(self.opts.get("eps", 1e-8)),
            weight_decay=float(self.opts.get("weight_decay", 0.0)),
        )
        total = sum(p.numel() * (self.tp if getattr(p, "tensor_model_parallel", False) else 1) for p in self._params())
        v = saved_version(path)
        self.version = max(self.version, v or 0)
        return {"trainable_params": int(total), "total_params": int(total), "weight_version": self.version}

    def op_compute_logprobs(self, batch, snapshot=None):
        self._ready("compute_logprobs")
        if snapshot is not None:
            return self._with_snapshot(snapshot, lambda: self.op_compute_logprobs(batch))
        seqs = batch["sequences"]
        self._check_batch(seqs)
        rows = []
        self.model.eval()
        with torch.no_grad():
            for chunk in self._micro_batches(seqs):
                pad = Padded(chunk, self.spec.vocab, self.device)
                rows += pad.completions(self._logprobs(pad))
        return self._gather_rows(rows, len(seqs))

    def op_train_step(self, batch):
        self._ready("train_step")
        loss_cfg = batch["loss"]
        lr = float(loss_cfg["learning_rate"])
        if not lr > 0.0 or lr == float("inf"):
            raise ValueError(f"train_step: learning_rate must be > 0 (got {lr})")
        seqs = batch["sequences"]
        self._check_batch(seqs, fields=("old_logprobs", "ref_logprobs"))
        kl_needed = loss_cfg["kind"] != "sft" and loss_cfg["kl_coef"] > 0
        if kl_needed and any(len(s.get("ref_logprobs") or []) == 0 and len(s["tokens"]) > int(s["prompt_len"]) for s in seqs):
            raise ValueError("train_step: kl_coef > 0 needs ref_logprobs on every sequence")
        z = normaliser(seqs, loss_cfg)
        self.model.train()
        sums = torch.zeros(5, dtype=torch.float64)
        # A DP rank without sequences runs one all-masked dummy so every parameter has a
        # (zero) gradient for the DP all-reduce.
        for chunk in self._micro_batches(seqs) or [[]]:
            pad = Padded(chunk, self.spec.vocab, self.device)
            lp = self._logprobs(pad)
            adv = torch.tensor([[float(s.get("advantage", 0.0))] for s in chunk] or [[0.0]], dtype=lp.dtype, device=lp.device)
            old = pad.aligned(chunk, "old_logprobs")
            ref = pad.aligned(chunk, "ref_logprobs")
            if ref is None and kl_needed:
                ref = lp.detach()  # the dummy, or completions without tokens: KL term 0
            weighted, part = policy_terms(lp, pad.mask, adv, old, ref, loss_cfg)
            # Each rank's share of the global sum / Z; the DP all-reduce (SUM) completes it.
            (weighted.sum() / z).backward()
            sums += part.cpu()
        self._sum_grads_over_dp()
        if self.dp > 1:
            sums = sums.to(self.device)
            dist.all_reduce(sums, group=self.dp_group)
            sums = sums.cpu()
        grad_norm = self._clip(float(loss_cfg.get("grad_clip", 0.0)))
        return self._finish_step(grad_norm, lr, sums, z)

    def _sum_grads_over_dp(self):
        """Sums gradients over the DP group, in flat buckets (the full-batch gradient)."""
        params = self._params()
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if self.dp == 1:
            return
        from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

        bucket, size = [], 0
        for i, p in enumerate(params):
            bucket.append(p.grad)
            size += p.grad.numel()
            if size >= BUCKET or i == len(params) - 1:
                flat = _flatten_dense_tensors(bucket)
                dist.all_reduce(flat, group=self.dp_group)
                for g, f in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
                    g.copy_(f)
                bucket, size = [], 0

    def _clip(self, clip):
        """The full model's gradient L2 norm; scales gradients to ``clip`` when above it.

        TP-sharded parameters add their shard's sum of squares and TP-replicated ones (the
        norms) count on TP rank 0 only, summed over the TP group. DP replicas hold identical
        gradients after the all-reduce, so the norm is not reduced over DP.
        """
        from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

        params = self._params()
        sq = torch.zeros((), dtype=torch.float64, device=self.device)
        for p in params:
            if param_is_not_tensor_parallel_duplicate(p):
                sq += torch.linalg.vector_norm(p.grad.float()).double().square()
        if self.tp > 1:
            dist.all_reduce(sq, group=self.tp_group)
        norm = float(sq.sqrt())
        if clip > 0 and norm == norm and norm != float("inf"):
            coef = clip / (norm + 1e-6)
            if coef < 1.0:
                for p in params:
                    p.grad.mul_(coef)
        return norm
