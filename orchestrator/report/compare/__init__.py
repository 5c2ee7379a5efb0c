"""A sweep's comparisons: the runs frame (one row per trial) -> results (``results``).

``across_seeds`` (seeds as independent samples: Kruskal-Wallis, post-hoc Mann-Whitney),
``by_seed`` (seeds as blocks: Friedman, paired permutation and Wilcoxon tests, paired effects,
MDE), ``verdicts`` (better / worse / not decided from the paired rows), ``tuning`` (each variant
at its own best value of a tuning axis). The statistics themselves live in
``orchestrator.report.stats``; the markdown in ``orchestrator.report.render``.
"""
