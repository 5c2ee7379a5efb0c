"""``model.router_prune`` in training: the top-p masks of the router's weights recomputed on a
schedule (``lime_arch.prune``; the paper's Table 5 and Figure 9 train with the mask applied).

``RouterPruneHook`` refreshes the masks before each step that ``RouterPrune.due`` names (so that
step runs with them) and zeroes the AdamW first moments of the pruned entries then, so a pruned
weight keeps its value exactly (its gradient is zero, and the router takes no weight decay) and is
ranked with it at the next refresh. The masks are buffers of the model: a checkpoint holds them
and a resumed trial continues with the same masks and schedule, bit for bit. Metrics: at every log
point ``prune/pruned_fraction``; at the end the counts of the paper's Table 5,
``final/pruned_weights`` of ``final/router_weights`` (``final/pruned_fraction``), the source
slots no longer read (``final/skipped_sources``), and per layer ``prune/pruned_weights/layer_<l>``.
Without ``model.router_prune`` the hook does nothing.
"""
from __future__ import annotations

from lime_arch import prune
from orchestrator.engine import final_names
from orchestrator.engine.trainer import Hook, Trainer


class RouterPruneHook(Hook):
    def before_step(self, t: Trainer) -> None:
        rp = t.mcfg.router_prune
        if rp is None or not rp.due(t.step):
            return
        router = t.model.router
        prune.refresh(router, rp.top_p, renormalize=rp.renormalize, step=t.step)
        masks = router.prune
        for l, w in enumerate(router.weights, start=1):
            state = t.optimizer.state.get(w)
            if state and "exp_avg" in state:
                state["exp_avg"].mul_(masks.mask(l))  # no momentum moves a pruned weight

    def log_metrics(self, t: Trainer) -> dict[str, float]:
        if t.mcfg.router_prune is None:
            return {}
        return {"prune/pruned_fraction": prune.stats(t.model.router).fraction}

    def final_metrics(self, t: Trainer) -> dict[str, float]:
        if t.mcfg.router_prune is None:
            return {}
        st = prune.stats(t.model.router)
        out = {final_names.PRUNED: float(sum(st.pruned)), final_names.ROUTER_WEIGHTS: float(sum(st.total)),
               final_names.PRUNED_FRACTION: st.fraction, final_names.SKIPPED: float(sum(map(len, st.skipped)))}
        out.update({f"prune/pruned_weights/layer_{l}": float(n) for l, n in enumerate(st.pruned) if l})
        return out
