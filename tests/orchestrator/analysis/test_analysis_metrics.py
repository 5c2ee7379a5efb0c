"""Tests of the representation-analysis math and plots (orchestrator.analysis.metrics, .plots).

Expectations are computed by hand (closed-form eigenvalues, hand-normalized router blocks), not
by re-running the implementation's formulas.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from orchestrator.analysis import (
    expected_source_layer,
    layer_entropies,
    probe_accuracy,
    renyi_entropy,
    router_source_map,
)
from orchestrator.analysis.plots import (
    plot_entropy,
    plot_expected_source,
    plot_probe,
    plot_router_map,
)

# ---------------------------------------------------------------- Renyi entropy


def test_identical_tokens_give_zero() -> None:
    rng = np.random.default_rng(0)
    # Random (not round) values: their mean over tokens need not be bit-exact, which must
    # still count as a constant feature rather than blow up into noise.
    x = np.tile(rng.normal(size=16), (10, 1)) * 0.1
    assert renyi_entropy(x) == 0.0
    assert renyi_entropy(x, alpha=1.0) == 0.0
    assert renyi_entropy(np.zeros((5, 3))) == 0.0
    assert renyi_entropy(np.ones((1, 7))) == 0.0  # one token


def test_hand_computed_three_token_example() -> None:
    # x = [[1,0],[0,1],[0,0]]. Column 0 = [1,0,0]: mean 1/3, population std sqrt(2)/3, so its
    # z-score is [2,-1,-1]/sqrt(2); column 1 likewise is [-1,2,-1]/sqrt(2). Then
    # K = Z Z^T = 1/2 [[5,-4,-1],[-4,5,-1],[-1,-1,2]]. Eigenvectors: (1,-1,0) -> 9/2,
    # (1,1,-2) -> 3/2, (1,1,1) -> 0. Normalized: 3/4 and 1/4.
    x = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    s_half = 2.0 * math.log(math.sqrt(0.75) + math.sqrt(0.25))
    s_two = -math.log(0.75**2 + 0.25**2)
    s_one = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert renyi_entropy(x) == pytest.approx(s_half, abs=1e-12)
    assert renyi_entropy(x, alpha=2.0) == pytest.approx(s_two, abs=1e-12)
    assert renyi_entropy(x, alpha=1.0) == pytest.approx(s_one, abs=1e-12)
    # Z-scoring (not mere centering) makes each feature's own scale irrelevant.
    x_rescaled = x * np.array([1.0, 250.0])
    assert renyi_entropy(x_rescaled) == pytest.approx(s_half, abs=1e-12)
    # A constant feature carries no information. 0.7 is chosen because mean([0.7]*3) != 0.7
    # in floating point: the residue must not be z-scored into a +-1 column.
    x_const = np.concatenate([x, np.full((3, 1), 0.7)], axis=1)
    assert np.full(3, 0.7).mean() != 0.7
    assert renyi_entropy(x_const) == pytest.approx(s_half, abs=1e-12)


@pytest.mark.parametrize("t", [2, 4, 9])
@pytest.mark.parametrize("alpha", [0.5, 1.0, 2.0])
def test_orthogonal_equal_norm_directions_give_log_t(t: int, alpha: float) -> None:
    # Tokens +e_i and -e_i for i < t: every feature already has mean 0 and std 1/sqrt(t), so
    # Z = sqrt(t) * x and K = t * [[I, -I], [-I, I]] has t equal eigenvalues 2t and t zeros:
    # a uniform spectrum over t directions -> log(t) for every alpha.
    eye = np.eye(t)
    x = np.concatenate([eye, -eye])
    assert renyi_entropy(x, alpha=alpha) == pytest.approx(math.log(t), abs=1e-10)


@pytest.mark.parametrize("t", [3, 8])
def test_one_hot_tokens_lose_one_direction_to_centering(t: int) -> None:
    # T one-hot tokens: z-scoring centers them, K is proportional to I - 11^T/T, whose
    # eigenvalues are 1 (T-1 times) and 0 -> log(T-1), not log(T).
    assert renyi_entropy(np.eye(t)) == pytest.approx(math.log(t - 1), abs=1e-10)


def test_invariant_to_scale_and_token_permutation() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(12, 6))
    base = renyi_entropy(x)
    assert 0.0 < base <= math.log(12)
    assert renyi_entropy(1e-6 * x) == pytest.approx(base, abs=1e-10)
    assert renyi_entropy(3.5e4 * x) == pytest.approx(base, abs=1e-10)
    assert renyi_entropy(x[rng.permutation(12)]) == pytest.approx(base, abs=1e-10)


def test_torch_input_matches_numpy() -> None:
    rng = np.random.default_rng(2)
    x = rng.normal(size=(7, 5))
    t = torch.tensor(x, dtype=torch.float32)
    assert renyi_entropy(t) == pytest.approx(renyi_entropy(x.astype(np.float32)), abs=1e-12)
    assert renyi_entropy(t) == pytest.approx(renyi_entropy(x), abs=1e-5)


def test_alpha_one_is_the_shannon_limit_and_entropy_decreases_in_alpha() -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(10, 4))
    shannon = renyi_entropy(x, alpha=1.0)
    assert renyi_entropy(x, alpha=1.0 - 1e-6) == pytest.approx(shannon, abs=1e-5)
    assert renyi_entropy(x, alpha=1.0 + 1e-6) == pytest.approx(shannon, abs=1e-5)
    values = [renyi_entropy(x, alpha=a) for a in (0.25, 0.5, 1.0, 2.0, 4.0)]
    assert all(a > b for a, b in zip(values, values[1:]))


def test_rank_one_signal_has_near_zero_entropy() -> None:
    rng = np.random.default_rng(4)
    u, v = rng.normal(size=32), rng.normal(size=16)
    offset = rng.normal(size=16)  # per-feature offsets vanish under z-scoring
    x = np.outer(u, v) + offset
    # Rounding-noise eigenvalues are cut off, so this is 0 to machine precision, not ~1e-8.
    assert renyi_entropy(x) == pytest.approx(0.0, abs=1e-12)
    assert renyi_entropy(x, alpha=2.0) == pytest.approx(0.0, abs=1e-12)


def test_invalid_inputs_raise() -> None:
    with pytest.raises(ValueError):
        renyi_entropy(np.zeros((2, 3, 4)))
    with pytest.raises(ValueError):
        renyi_entropy(np.zeros((3, 3)), alpha=0.0)
    with pytest.raises(ValueError):
        renyi_entropy(np.array([[1.0, np.nan], [0.0, 1.0]]))


def test_layer_entropies_mean_and_std_over_sequences() -> None:
    t = 5
    identical = np.ones((2, t, t))
    mixed = np.stack([np.ones((t, t)), np.eye(t)])  # entropies 0 and log(t-1)
    means, stds = layer_entropies([identical, mixed])
    assert means.shape == stds.shape == (2,)
    assert means[0] == 0.0 and stds[0] == 0.0
    assert means[1] == pytest.approx(math.log(t - 1) / 2, abs=1e-10)
    assert stds[1] == pytest.approx(math.log(t - 1) / 2, abs=1e-10)  # population std


# ---------------------------------------------------------------- probe


def _blobs(n_per_class: int, n_classes: int, dim: int, sep: float, seed: int):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(n_classes, dim)) * sep
    y = np.repeat(np.arange(n_classes), n_per_class)
    x = centers[y] + rng.normal(size=(len(y), dim))
    return x, y


@pytest.mark.filterwarnings("error")  # e.g. a ConvergenceWarning from too few iterations
def test_probe_separable_data_is_near_perfect() -> None:
    x, y = _blobs(40, 4, 8, sep=10.0, seed=0)
    mean, std = probe_accuracy(x, y)
    assert mean >= 0.98
    assert 0.0 <= std <= 0.05


def test_probe_on_label_independent_features_is_near_chance() -> None:
    rng = np.random.default_rng(5)
    y = np.repeat(np.array(["is", "are", "was", "were"]), 60)
    x = rng.normal(size=(len(y), 8))
    mean, _ = probe_accuracy(x, y, seed=0)
    assert abs(mean - 0.25) <= 0.15


def test_probe_on_collapsed_representations_is_exactly_chance() -> None:
    # All classes share one representation: the probe can only predict one class, and with
    # balanced stratified folds it is right for exactly 1/3 of every test fold.
    y = np.repeat(np.arange(3), 30)
    x = np.tile(np.array([[0.3, -1.2, 2.0]]), (len(y), 1))
    mean, std = probe_accuracy(x, y)
    assert mean == pytest.approx(1 / 3, abs=1e-12)
    assert std == pytest.approx(0.0, abs=1e-12)


def test_probe_is_deterministic_for_a_seed() -> None:
    x, y = _blobs(20, 3, 5, sep=1.0, seed=1)
    assert probe_accuracy(x, y, seed=7) == probe_accuracy(x, y, seed=7)


def test_probe_rare_class_error_names_class_and_counts() -> None:
    rng = np.random.default_rng(6)
    y = np.array(["is"] * 20 + ["are"] * 20 + ["were"] * 3)
    x = rng.normal(size=(len(y), 4))
    with pytest.raises(ValueError, match=r"'were' \(3 samples\).*folds=5") as info:
        probe_accuracy(x, y, folds=5)
    assert "'is': 20" in str(info.value) and "'are': 20" in str(info.value)
    # Three folds are enough for three samples.
    probe_accuracy(x, y, folds=3)


def test_probe_single_class_raises() -> None:
    with pytest.raises(ValueError, match="at least 2 classes"):
        probe_accuracy(np.zeros((10, 2)), np.zeros(10, dtype=int))


# ---------------------------------------------------------------- router maps


def test_identity_router_map_and_expected_layer() -> None:
    n_layers = 6
    dense = [None] * n_layers
    np.testing.assert_array_equal(router_source_map(dense, n_kv_heads=4), np.eye(n_layers))
    np.testing.assert_array_equal(expected_source_layer(dense, 4), np.arange(n_layers))


def test_identity_blocks_give_identity_map() -> None:
    # Dense routers that hold I in the current layer's block and zeros elsewhere read only
    # the current layer: same result as no router.
    r, n_layers = 3, 4
    dense = [None] + [
        np.concatenate([np.zeros((r, l * r)), np.eye(r)], axis=1) for l in range(1, n_layers)
    ]
    np.testing.assert_allclose(router_source_map(dense, r), np.eye(n_layers))
    np.testing.assert_allclose(expected_source_layer(dense, r), np.arange(n_layers))


def _hand_example() -> list[np.ndarray | None]:
    # R = 2. Layer 1: block means of |w| are 1 and 1.5 -> [0.4, 0.6], expected 0.6.
    # Layer 2: block means 0.5, 0.5, 2 (total 3) -> [1/6, 1/6, 2/3], expected 1/6 + 4/3 = 1.5.
    layer1 = np.array([[1.0, -1.0, 3.0, 0.0], [1.0, 1.0, 0.0, -3.0]])
    layer2 = np.array(
        [[0.5, -0.5, 0.0, 1.0, -2.0, 2.0], [0.5, 0.5, -1.0, 0.0, 2.0, -2.0]]
    )
    return [None, layer1, layer2]


def test_hand_made_three_layer_router() -> None:
    expected_map = np.array(
        [[1.0, 0.0, 0.0], [0.4, 0.6, 0.0], [1 / 6, 1 / 6, 2 / 3]]
    )
    np.testing.assert_allclose(router_source_map(_hand_example(), 2), expected_map, atol=1e-12)
    np.testing.assert_allclose(expected_source_layer(_hand_example(), 2), [0.0, 0.6, 1.5],
                               atol=1e-12)


def test_per_dim_router_averages_over_head_dim() -> None:
    # Each scalar weight becomes an Hd-vector w * c; mean |w * c| over Hd = |w| * mean|c|,
    # a common factor that the per-layer normalization removes.
    c = np.array([1.0, -2.0, 0.5])
    per_dim = [None] + [w[..., None] * c for w in _hand_example()[1:]]
    np.testing.assert_allclose(router_source_map(per_dim, 2),
                               router_source_map(_hand_example(), 2), atol=1e-12)
    per_dim_t = [None] + [torch.tensor(w) for w in per_dim[1:]]
    np.testing.assert_allclose(expected_source_layer(per_dim_t, 2), [0.0, 0.6, 1.5], atol=1e-12)


def test_router_shape_mismatch_and_zero_router() -> None:
    with pytest.raises(ValueError, match="layer 1"):
        router_source_map([None, np.ones((2, 6))], n_kv_heads=2)
    result = expected_source_layer([None, np.zeros((2, 4))], n_kv_heads=2)
    assert result[0] == 0.0 and np.isnan(result[1])


# ---------------------------------------------------------------- plots


def _make_all_plots(directory, scale: float = 1.0) -> list:
    layers = np.arange(4, dtype=float)
    entropy = {"llama": (scale * (3 - 0.5 * layers), 0.1 * np.ones(4)),
               "full": (scale * (3 - 0.1 * layers), 0.2 * np.ones(4))}
    probe = {"llama": (np.array([0.9, 0.7, 0.5, 0.4]), np.full(4, 0.05)),
             "full": (np.array([0.9, 0.85, 0.8, 0.8]), np.full(4, 0.03))}
    source_map = router_source_map(_hand_example(), 2)
    expected = {"none": np.arange(3.0), "full": expected_source_layer(_hand_example(), 2)}
    return [
        plot_entropy(entropy, directory / "entropy.png", "value entropy"),
        plot_probe(probe, directory / "probe.png"),
        plot_router_map(source_map, directory / "router.png", "full router"),
        plot_expected_source(expected, directory / "expected.png"),
    ]


def test_plots_write_byte_identical_pngs(tmp_path) -> None:
    first = [p.read_bytes() for p in _make_all_plots(tmp_path / "a")]
    second = [p.read_bytes() for p in _make_all_plots(tmp_path / "b")]
    for a, b in zip(first, second):
        assert a.startswith(b"\x89PNG\r\n\x1a\n") and len(a) > 1000
        assert a == b
    # Different data must change the picture, or the identity check above proves nothing.
    changed = _make_all_plots(tmp_path / "c", scale=2.0)[0].read_bytes()
    assert changed != first[0]
