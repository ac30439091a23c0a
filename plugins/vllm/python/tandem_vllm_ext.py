"""Tandem's vLLM worker extension (``--worker-extension-cls
tandem_vllm_ext.TandemWorkerExtension``), written next to the run by the `vllm` plugin.

``tandem_reload_weights(weights_path)`` is vLLM's ``reload_weights`` plus one repair: on the
CPU backend, ``lm_head`` runs through a GEMM handler prepared from its weight when the model
was loaded. With tied embeddings the checkpoint has no ``lm_head.weight``; the in-place reload
updates ``embed_tokens`` (which ``lm_head`` shares) but leaves that handler packed from the old
weights, so the server samples from stale logits. Re-dispatching the handler after the reload
makes the served logits those of the new checkpoint.
"""


class TandemWorkerExtension:
    """Methods mixed into vLLM's worker class, callable through ``/collective_rpc``."""

    def tandem_reload_weights(self, weights_path):
        runner = self.model_runner
        runner.reload_weights(weights_path=weights_path)
        model = runner.get_model()
        cfg = getattr(model, "config", None)
        tied = bool(getattr(cfg, "tie_word_embeddings", False))
        repaired = False
        inner = getattr(model, "model", None)
        if tied and hasattr(model, "lm_head") and hasattr(inner, "embed_tokens"):
            from vllm.platforms import current_platform

            model.lm_head.weight = inner.embed_tokens.weight
            if current_platform.is_cpu():
                from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

                dispatch_cpu_unquantized_gemm(model.lm_head, remove_weight=False)
                repaired = True
        return {"tied": tied, "lm_head_redispatched": repaired}
