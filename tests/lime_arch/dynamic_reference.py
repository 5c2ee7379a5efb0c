"""The dynamic router in every form ``model.router_dynamic`` names, as a float64 reference written
here from the paper's Appendix E (arXiv 2502.09245) and the LIMe authors' v1 description
(/work/shared/FIELD.md), sharing no code with lime_arch: plain loops over routed heads and
softmax columns, scalar gates. A form is (scores, softmax, gate):

  scores   "query": s = qbar[h] . key / sqrt(Hd), qbar[h] the mean of the query heads whose KV
           head is h (groups of H/R consecutive heads); "hidden": s = x . key, x the layer's
           normed attention input (B, T, D), no scale (a bias-free linear map)
  softmax  "layers-heads": columns (i, h') for every source slot i and head h', source-major;
           "layers": columns i, routed head h reading head h of slot i
  gate     True: the last entry of each row of w is g[h], routed = own + g (mix - own);
           False: routed = mix

``route(form)`` is a routing reference with the signature of ``kind_references.py``'s, plus the
layer's normed input ``x``; ``counts(form, sources, R, Hd, D)`` gives one layer's parameters and
MACs per token, counted by hand."""
import math

import torch

FORMS = [(s, m, g) for s in ("query", "hidden") for m in ("layers-heads", "layers") for g in (True, False)]
V1 = ("hidden", "layers", False)  # the authors' v1 code
PAPER = ("query", "layers-heads", False)  # the paper's Appendix E wording
DEFAULT = ("query", "layers-heads", True)  # what every earlier run trained


def options(form, weight_decay=False):
    """The config mapping of a form (``model.router_dynamic``)."""
    scores, softmax, gate = form
    return {"scores": scores, "softmax": softmax, "gate": gate, "weight_decay": weight_decay}


def _columns(softmax, n_sources, R, h):
    """(source index, source head) per softmax column of routed head h."""
    if softmax == "layers-heads":
        return [(i, g) for i in range(n_sources) for g in range(R)]
    return [(i, h) for i in range(n_sources)]


def route(form):
    scores, softmax, gate = form

    def ref(w, sources, kbuf, vbuf, l, q, x=None):
        if w is None:
            return kbuf[l], vbuf[l]
        B, R, T, Hd = kbuf[0].shape
        H = q.shape[1]
        G = H // R
        E = Hd if scores == "query" else x.shape[-1]
        ks, vs = [], []
        for h in range(R):
            cols = _columns(softmax, len(sources), R, h)
            m = len(cols)
            if scores == "query":
                u = sum(q[:, h * G + j] for j in range(G)) / G  # (B, T, Hd)
                z = [(u * w[h, c * E:(c + 1) * E]).sum(-1) / math.sqrt(Hd) for c in range(m)]
            else:
                z = [(x * w[h, c * E:(c + 1) * E]).sum(-1) for c in range(m)]  # (B, T)
            top = z[0]
            for s in z[1:]:
                top = top.maximum(s)
            e = [(s - top).exp() for s in z]
            tot = sum(e)
            mk = sum((e[c] / tot)[..., None] * kbuf[sources[i]][:, g] for c, (i, g) in enumerate(cols))
            mv = sum((e[c] / tot)[..., None] * vbuf[sources[i]][:, g] for c, (i, g) in enumerate(cols))
            if gate:
                gh = w[h, m * E]
                mk = kbuf[l][:, h] + gh * (mk - kbuf[l][:, h])
                mv = vbuf[l][:, h] + gh * (mv - vbuf[l][:, h])
            ks.append(mk)
            vs.append(mv)
        return torch.stack(ks, dim=1), torch.stack(vs, dim=1)

    return ref


def counts(form, n_sources, R, Hd, D):
    """(parameters, MACs per token) of one layer l >= 1 reading ``n_sources`` slots: keys m x E per
    routed head (m columns, E = Hd or D) plus its gate; the scores (R m E) and the mixing of K and
    V (2 R m Hd)."""
    scores, softmax, gate = form
    m = n_sources * R if softmax == "layers-heads" else n_sources
    E = Hd if scores == "query" else D
    return R * (m * E + int(gate)), R * m * E + 2 * R * m * Hd
