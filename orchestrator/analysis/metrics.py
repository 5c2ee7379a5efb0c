"""Pure-math representation diagnostics of LIMe models (the paper's analysis section, arXiv 2502.09245).

Everything here works on plain arrays (numpy, or torch tensors, which are copied to float64
numpy), so the same numbers come out whether they are computed at the end of a trial or later
from a checkpoint. Model capture and logging live elsewhere.

Definitions
-----------
* Matrix-based Renyi entropy of one sequence ``x`` of shape (T, D): every feature is z-scored
  over the T tokens (population std; a feature that is constant over the tokens becomes 0),
  ``K = Z Z^T`` in float64, its eigenvalues are clamped at 0 (eigenvalues below the numerical
  rank cutoff T * eps * max eigenvalue count as 0: they are rounding noise) and divided by their
  sum, and ``S_alpha = log(sum(lambda**alpha)) / (1 - alpha)`` (natural log; alpha == 1 is the
  Shannon limit ``-sum(lambda * log(lambda))``). A Gram matrix with zero trace (all tokens
  identical, or T == 1) gives 0.0. Because z-scoring removes the mean over tokens, the rows of
  Z always sum to zero, so T tokens span at most T - 1 directions: T one-hot tokens give
  log(T - 1), and T orthogonal directions each present with its antipode (2T tokens) give
  log(T).
* Router source map ``M`` (paper Fig. 5): for layer l and source layer s <= l, the mean |w| over
  the (R x R) block of the layer's dense mixing matrix that reads layer s (and over Hd for the
  per-dim router), normalized so the row sums to 1; zeros for s > l. A layer without a router
  (layer 0, or the 'none'/identity router) reads only its own K/V: row one-hot at s = l. A router
  whose weights are all exactly zero reads nothing, so its row is NaN rather than a made-up
  distribution.
* Expected retrieved source layer (paper Fig. 4): ``E[l] = sum_s s * M[l, s]``, i.e. the mean
  source-layer index weighted by |weight| mass. Blocks all have R x R entries, so mean-|w| and
  total-|w| weighting coincide. With the identity router E[l] == l; the gap ``l - E[l]`` is how
  far back the layer reaches on average.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = [
    "renyi_entropy",
    "layer_entropies",
    "probe_accuracy",
    "router_source_map",
    "expected_source_layer",
]

# A feature whose std over tokens is this small relative to its magnitude is treated as
# constant: the mean of identical floats is not always bit-exact, and dividing that rounding
# residue by an equally tiny std would turn a constant feature into O(1) noise. Relative (not
# absolute) so the entropy stays invariant to rescaling the input.
_CONSTANT_FEATURE_RTOL = 1e-9

# Upper bound on Gram-matrix entries computed at once (x 8 bytes: 128 MiB).
_GRAM_BATCH_ELEMENTS = 1 << 24


def _as_float64(x: Any) -> np.ndarray:
    """Copy a numpy array or torch tensor (any dtype, any device) to a float64 numpy array."""
    if hasattr(x, "detach"):  # torch tensor, without importing torch here
        x = x.detach().to("cpu").double().numpy()
    return np.asarray(x, dtype=np.float64)


def _zscore_tokens(x: np.ndarray) -> np.ndarray:
    """Z-score the last axis' features over the token axis (-2); constant features -> 0."""
    mean = x.mean(axis=-2, keepdims=True)
    centered = x - mean
    std = np.sqrt((centered**2).mean(axis=-2, keepdims=True))
    scale = np.abs(x).max(axis=-2, keepdims=True)
    constant = std <= _CONSTANT_FEATURE_RTOL * scale
    safe_std = np.where(constant, 1.0, std)
    return np.where(constant, 0.0, centered / safe_std)


def _renyi_batched(x: np.ndarray, alpha: float) -> np.ndarray:
    """Renyi entropy of each sequence of a (N, T, D) float64 batch -> (N,)."""
    if not np.all(np.isfinite(x)):
        raise ValueError("representations contain NaN or inf; entropy is undefined")
    z = _zscore_tokens(x)
    gram = z @ np.swapaxes(z, -1, -2)
    eig = np.linalg.eigvalsh(gram)
    # Clamp at 0, and also zero the eigenvalues that are pure rounding noise (the usual
    # numerical-rank cutoff, T * eps * largest eigenvalue): for alpha < 1 each contributes
    # lambda**alpha >> lambda, so a rank-1 signal would otherwise read ~1e-8 instead of 0 and
    # rescaling the input would move the entropy in the 9th digit.
    cutoff = gram.shape[-1] * np.finfo(np.float64).eps * eig[..., -1:]
    eig = np.where(eig > cutoff, eig, 0.0)
    trace = eig.sum(axis=-1)
    out = np.zeros(x.shape[0], dtype=np.float64)
    for i in np.flatnonzero(trace > 0):
        lam = eig[i] / trace[i]
        # Zero eigenvalues contribute nothing for alpha > 0 (and 0 * log 0 := 0); dropping
        # them avoids log(0) warnings in the Shannon branch.
        lam = lam[lam > 0]
        if abs(alpha - 1.0) < 1e-12:
            out[i] = float(-(lam * np.log(lam)).sum())
        else:
            out[i] = float(np.log((lam**alpha).sum()) / (1.0 - alpha))
    return out


def _check_alpha(alpha: float) -> None:
    if not np.isfinite(alpha) or alpha <= 0:
        raise ValueError(f"alpha must be a finite positive number, got {alpha!r}")


def renyi_entropy(x: Any, alpha: float = 0.5) -> float:
    """Matrix-based Renyi entropy of one sequence's token representations ``x`` of shape (T, D).

    See the module docstring for the exact definition. Accepts numpy arrays or torch tensors.
    """
    _check_alpha(alpha)
    arr = _as_float64(x)
    if arr.ndim != 2:
        raise ValueError(f"expected one sequence of shape (T, D), got shape {arr.shape}")
    return float(_renyi_batched(arr[None], alpha)[0])


def layer_entropies(reps: list[Any], alpha: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """Per-layer mean and std (over sequences, population std) of the Renyi entropy.

    ``reps[l]`` holds layer l's representations of shape (N_seq, T, D); each sequence is one
    Gram matrix. Returns two arrays of shape (L,).
    """
    _check_alpha(alpha)
    means = np.zeros(len(reps), dtype=np.float64)
    stds = np.zeros(len(reps), dtype=np.float64)
    for layer, rep in enumerate(reps):
        arr = _as_float64(rep)
        if arr.ndim != 3 or arr.shape[0] == 0:
            raise ValueError(
                f"layer {layer}: expected a non-empty (N_seq, T, D) array, got shape {arr.shape}"
            )
        # Chunked so the (chunk, T, T) Gram stack stays small even for long sequences.
        chunk = max(1, _GRAM_BATCH_ELEMENTS // max(1, arr.shape[1] ** 2))
        values = np.concatenate(
            [_renyi_batched(arr[i : i + chunk], alpha) for i in range(0, arr.shape[0], chunk)]
        )
        means[layer] = values.mean()
        stds[layer] = values.std()
    return means, stds


def probe_accuracy(
    x: Any, y: Any, folds: int = 5, seed: int = 0
) -> tuple[float, float]:
    """Linear-probe accuracy: mean and std over stratified k-fold cross-validation.

    The probe is a scikit-learn Pipeline of StandardScaler and LogisticRegression, evaluated
    with ``StratifiedKFold(folds, shuffle=True, random_state=seed)``. Raises ValueError when
    there is only one class or a class has fewer than ``folds`` samples (stratification would
    leave some fold without it, and the accuracy would be meaningless).
    """
    # Imported here so `import orchestrator.analysis` stays cheap for code that never probes.
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if folds < 2:
        raise ValueError(f"folds must be >= 2, got {folds}")
    feats = _as_float64(x)
    labels = y.detach().cpu().numpy() if hasattr(y, "detach") else np.asarray(y)
    if feats.ndim != 2:
        raise ValueError(f"expected features of shape (N, D), got shape {feats.shape}")
    if labels.ndim != 1 or labels.shape[0] != feats.shape[0]:
        raise ValueError(
            f"expected labels of shape ({feats.shape[0]},), got shape {labels.shape}"
        )
    if not np.all(np.isfinite(feats)):
        raise ValueError("features contain NaN or inf")
    classes, counts = np.unique(labels, return_counts=True)
    summary = ", ".join(f"{c!r}: {n}" for c, n in zip(classes.tolist(), counts.tolist()))
    if len(classes) < 2:
        raise ValueError(f"probe needs at least 2 classes, got only ({summary})")
    rare = [(c, n) for c, n in zip(classes.tolist(), counts.tolist()) if n < folds]
    if rare:
        names = ", ".join(f"{c!r} ({n} samples)" for c, n in rare)
        raise ValueError(
            f"class {names} has fewer than folds={folds} samples; counts per class: "
            f"{{{summary}}}. Use more evaluation data, fewer folds, or drop the class."
        )
    probe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=5000))
    cv = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    scores = cross_val_score(probe, feats, labels, cv=cv, scoring="accuracy")
    return float(scores.mean()), float(scores.std())


def router_source_map(dense: list[Any | None], n_kv_heads: int) -> np.ndarray:
    """(L, L) normalized mean-|weight| map from layer (rows) to source layer (columns).

    ``dense[l]`` is layer l's dense mixing matrix of shape (R, (l+1)*R), or (R, (l+1)*R, Hd) for
    the per-dim router, or None when the layer reads only its own K/V (layer 0, identity router).
    Column block s (``[:, s*R:(s+1)*R]``) holds the weights on source layer s.
    """
    r = int(n_kv_heads)
    if r < 1:
        raise ValueError(f"n_kv_heads must be >= 1, got {n_kv_heads}")
    n_layers = len(dense)
    out = np.zeros((n_layers, n_layers), dtype=np.float64)
    for layer, w in enumerate(dense):
        if w is None:
            out[layer, layer] = 1.0
            continue
        arr = np.abs(_as_float64(w))
        width = (layer + 1) * r
        if arr.ndim not in (2, 3) or arr.shape[:2] != (r, width):
            raise ValueError(
                f"layer {layer}: expected a dense router of shape ({r}, {width}) or "
                f"({r}, {width}, Hd), got {arr.shape}"
            )
        if arr.ndim == 3:
            arr = arr.mean(axis=2)  # per-dim router: one scalar per (head, source head)
        # (R, (l+1)R) -> (R, l+1, R): mean over the R x R block of every source layer.
        block_mass = arr.reshape(r, layer + 1, r).mean(axis=(0, 2))
        total = block_mass.sum()
        if not np.isfinite(total):
            raise ValueError(f"layer {layer}: router weights contain NaN or inf")
        if total == 0:
            out[layer, :] = np.nan
        else:
            out[layer, : layer + 1] = block_mass / total
    return out


def expected_source_layer(dense: list[Any | None], n_kv_heads: int) -> np.ndarray:
    """(L,) |weight|-mass-weighted mean source layer index, ``sum_s s * M[l, s]`` (Fig. 4).

    Equals ``arange(L)`` for the identity/'none' router; NaN for an all-zero router.
    """
    source_map = router_source_map(dense, n_kv_heads)
    return source_map @ np.arange(source_map.shape[1], dtype=np.float64)
