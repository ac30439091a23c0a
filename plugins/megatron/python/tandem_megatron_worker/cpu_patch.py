"""Two runtime patches that let megatron-core 0.16.1 run on CPU (gloo), applied only to a rank
whose device is ``cpu``.

Nothing in site-packages is edited; both patches change process-global state, so a process that
uses a GPU must never apply them (``apply`` refuses a non-CPU device). Line numbers are those of
megatron-core 0.16.1 (``megatron/core/...``).

P-A ``torch.cuda.current_device`` answers ``"cpu"``. Megatron-core takes "the device" from
    ``torch.cuda.current_device()`` in 175 places; on the forward path the first are
    ``models/common/embeddings/rotary_pos_embedding.py:162`` (``inv_freq`` moved to the current
    device), ``utils.py:631`` (``GlobalMemoryBuffer.get_tensor``, reached from
    ``transformer/dot_product_attention.py:189`` and ``tensor_parallel/mappings.py:139-188``),
    ``tensor_parallel/mappings.py:91`` and ``tensor_parallel/layers.py``. Without a GPU each
    raises; with the patch each allocates on CPU.

P-B a CPU RNG tracker in place of ``CudaRNGStatesTracker``. ``dot_product_attention.py:217``
    always enters ``get_cuda_rng_tracker().fork()`` when ``sequence_parallel`` is off (even
    with dropout 0), and ``fork`` reads the CUDA generator (``tensor_parallel/random.py:250``);
    seeding through ``model_parallel_cuda_manual_seed`` (``random.py:378``) calls
    ``torch.cuda.get_rng_state`` in ``add`` (``random.py:235``). The replacement keeps named
    states of the CPU generator instead.

Not patched but avoided: ``transformer/utils.py:35`` (``get_default_causal_mask`` allocates on
``"cuda"``) is never reached because the trainer always passes an explicit causal mask.
"""

import contextlib

import torch

_applied = False


def _cpu_tracker_class():
    from megatron.core.tensor_parallel import random as tpr

    class CpuRngTracker(tpr.CudaRNGStatesTracker):
        """Named states of the CPU generator, with the checks megatron's tracker makes."""

        def add(self, name, seed):
            self._is_initialized = True
            if seed in self.seeds_:
                raise RuntimeError(f"rng seed {seed} is already tracked")
            if name in self.states_:
                raise RuntimeError(f"rng state `{name}` is already tracked")
            self.seeds_.add(seed)
            outer = torch.get_rng_state()
            torch.manual_seed(seed)
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(outer)

        @contextlib.contextmanager
        def fork(self, name=tpr._MODEL_PARALLEL_RNG_TRACKER_NAME):
            if name not in self.states_:
                raise RuntimeError(f"rng state `{name}` is not tracked")
            outer = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(outer)

    return CpuRngTracker


def apply(device):
    """Installs P-A and P-B for a CPU rank; refuses any other device."""
    global _applied
    device = torch.device(device)
    if device.type != "cpu":
        raise RuntimeError(f"cpu_patch.apply: device {device} is not the CPU; the patches are process-global and CPU-only")
    if _applied:
        return
    from megatron.core.tensor_parallel import random as tpr

    torch.cuda.current_device = lambda: "cpu"  # P-A
    tpr._CUDA_RNG_STATE_TRACKER = _cpu_tracker_class()()  # P-B
    tpr._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    _applied = True


def seed(value):
    """The CPU stand-in for ``tensor_parallel.model_parallel_cuda_manual_seed`` (random.py:378):
    the default generator gets ``value``; the tracked states get the same offsets megatron uses
    (data-parallel ``value``, tensor-parallel ``value + 2718 + tp_rank``, expert ``value + 1024``)."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import random as tpr

    tracker = tpr._CUDA_RNG_STATE_TRACKER
    tracker.reset()
    torch.manual_seed(value)
    tracker.add(tpr._DATA_PARALLEL_RNG_TRACKER_NAME, value)
    tracker.add(tpr._MODEL_PARALLEL_RNG_TRACKER_NAME, value + 2718 + ps.get_tensor_model_parallel_rank())
    tracker.add(tpr._EXPERT_PARALLEL_RNG_TRACKER_NAME, value + 1024)
