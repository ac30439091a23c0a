"""What every torchrun trainer does with its state beside the model math: the init/offload
guard, actor/ref snapshots (TensorBackuper semantics), memory tags, the AdamW step, stats.

``TrainerState`` is a base class: its ``__init__`` sets the state every trainer has (``cfg``,
``opts``, ``rank``, ``world``, ``device``, ``model``, ``optim``, ``version``, ``snapshots``,
``offloaded``); the trainer sets ``NAME``, fills ``model`` and ``optim`` at init, and defines ``_snapshot_params()`` (the tensors a snapshot holds, in a stable
order), ``_backup(obj)`` (a copy of a tensor or an optimizer state dict that outlives later
in-place updates) and may extend ``_extra_metrics()``.
"""

import torch
import torch.distributed as dist

from .files import rss_bytes

OFFLOADABLE = ("weights", "grads", "optimizer", "activations")
SCRATCH = "tandem.trainer/scratch"


class TrainerState:
    """Snapshots, memory tags and stats of a torchrun trainer (see the module doc)."""

    NAME = "?"

    def __init__(self, cfg, rank, world):
        self.cfg = cfg
        self.opts = cfg["options"]
        self.rank = rank
        self.world = world
        self.device = torch.device(cfg["device"])
        self.model = None
        self.optim = None
        self.version = 0
        self.snapshots = {}
        self.offloaded = set()

    def _ready(self, op):
        if self.model is None:
            raise RuntimeError(f"{op}: trainer `{self.NAME}` is not initialised; call init first")
        if self.offloaded:
            raise RuntimeError(f"{op}: {sorted(self.offloaded)} are offloaded; call onload first")

    def _adam_step(self):
        step = 0
        for st in self.optim.state.values():
            s = st.get("step")
            if s is not None:
                step = max(step, int(s.item() if torch.is_tensor(s) else s))
        return step

    def _state(self):
        return {"weight_version": self.version, "adam_step": self._adam_step()}

    def _finish_step(self, grad_norm, lr, sums, z):
        """Applies the optimizer step unless the gradient norm is not finite (the step is then
        skipped), frees the gradients, and returns the step's metrics from the all-reduced
        ``sums`` (``[loss·Z, nll·Z, kl·Z, clipped tokens, tokens]``) and the normaliser ``z``."""
        applied = grad_norm == grad_norm and grad_norm != float("inf")
        if applied:
            for g in self.optim.param_groups:
                g["lr"] = lr
            self.optim.step()
            self.version += 1
        self.optim.zero_grad(set_to_none=True)
        tokens = float(sums[4])
        d = max(tokens, 1.0)
        return {
            "loss": float(sums[0]) / z,
            "nll": float(sums[1]) / d,
            "kl": float(sums[2]) / d,
            "clip_frac": float(sums[3]) / d,
            "tokens": tokens,
            "grad_norm": grad_norm if applied else None,
            "applied": 1.0 if applied else 0.0,
            "weight_version": float(self.version),
        }

    # ---- snapshots -----------------------------------------------------------------------

    def op_snapshot(self, name):
        self._ready("snapshot")
        if name == SCRATCH:
            raise ValueError(f"snapshot name `{name}` is reserved")
        self._take(name)

    def _take(self, name, with_optim=True):
        with torch.no_grad():
            params = [self._backup(p.detach()) for p in self._snapshot_params()]
        self.snapshots[name] = {
            "params": params,
            "optim": self._backup(self.optim.state_dict()) if with_optim else None,
            "version": self.version,
        }

    def _put(self, name, meta):
        snap = self.snapshots.get(name)
        if snap is None:
            raise ValueError(f"restore: no snapshot named `{name}` (taken: {sorted(self.snapshots)})")
        with torch.no_grad():
            for p, s in zip(self._snapshot_params(), snap["params"]):
                p.copy_(s)
        if meta:
            # load_state_dict may keep the tensors it is given: hand it copies, not the snapshot.
            self.optim.load_state_dict(self._backup(snap["optim"]))
            self.version = snap["version"]

    def _with_snapshot(self, name, fn):
        if name not in self.snapshots:
            raise ValueError(f"compute_logprobs: no snapshot named `{name}` (taken: {sorted(self.snapshots)})")
        self._take(SCRATCH, with_optim=False)
        try:
            self._put(name, meta=False)
            return fn()
        finally:
            self._put(SCRATCH, meta=False)
            del self.snapshots[SCRATCH]

    def op_restore(self, name):
        self._ready("restore")
        self._put(name, meta=True)

    def op_drop_snapshot(self, name):
        self.snapshots.pop(name, None)

    # ---- memory --------------------------------------------------------------------------

    def _check_tags(self, tags, op):
        bad = [t for t in tags if t not in OFFLOADABLE]
        if bad:
            raise ValueError(f"{op}: unknown tag `{bad[0]}` (known: {', '.join(OFFLOADABLE)})")
        if self.model is None:
            raise RuntimeError(f"{op}: trainer `{self.NAME}` is not initialised; call init first")

    def op_offload(self, tags):
        self._check_tags(tags, "offload")
        # Gradients are freed (not kept) after every step; on an accelerator, parameters and
        # optimizer moments move to host memory. On CPU they already live in host memory.
        if "grads" in tags:
            self.optim.zero_grad(set_to_none=True)
        if self.device.type != "cpu":
            self._move(tags, torch.device("cpu"))
        self.offloaded.update(tags)

    def op_onload(self, tags):
        self._check_tags(tags, "onload")
        if self.device.type != "cpu":
            self._move([t for t in tags if t in self.offloaded], self.device)
        self.offloaded.difference_update(tags)

    def _move(self, tags, device):
        with torch.no_grad():
            if "weights" in tags:
                for p in self.model.parameters():
                    p.data = p.data.to(device)
            if "optimizer" in tags:
                for st in self.optim.state.values():
                    for k, v in st.items():
                        if torch.is_tensor(v) and k != "step":
                            st[k] = v.to(device)
        if device.type == "cpu" and torch.cuda.is_available():
            torch.cuda.empty_cache()

    # ---- stats ---------------------------------------------------------------------------

    def _extra_metrics(self):
        """Metrics a trainer adds once initialised."""
        return {"optimizer_step": float(self._adam_step())}

    def op_stats(self):
        rss_all = [None] * self.world
        dist.all_gather_object(rss_all, rss_bytes())
        if self.model is None:
            state = "uninitialised"
        elif self.offloaded:
            state = "offloaded: " + ",".join(sorted(self.offloaded))
        else:
            state = "ready"
        metrics = {
            "ranks": float(self.world),
            "snapshots": float(len(self.snapshots)),
            "rss_bytes.total": float(sum(rss_all)),
        }
        if self.model is not None:
            metrics.update(self._extra_metrics())
        return {"weight_version": self.version, "state": state, "metrics": metrics}
