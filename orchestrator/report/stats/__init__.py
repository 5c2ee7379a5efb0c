"""Pure statistics on plain arrays: no MLflow, no pandas frames of runs, no report text.

``paired`` (tests of per-seed differences: sign-flip permutation, Wilcoxon, Friedman, and the
smallest p a design can reach), ``ranks`` (rank tests of independent samples: Mann-Whitney,
Kruskal-Wallis, Cliff's delta), ``multiplicity`` (Holm) and ``power`` (power and detectable
effects by seeded simulation).
Each is checked against scipy, statsmodels or a hand-worked table in ``tests/orchestrator/report``.
"""
