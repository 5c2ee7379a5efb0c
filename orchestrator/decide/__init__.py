"""Decisions that hold: intervals, confidence sequences and the verdict read off them (torch-free).

Shared by the report (``orchestrator.report``: the verdicts of a finished sweep) and the sweep layer
(``orchestrator.sweep.decide``: ``lime sweep run --until-decided`` adds seeds in waves until every
comparison is decided), which may not import each other. Everything works on plain arrays and
numbers:

  intervals    the fixed-n interval of a paired mean difference: the hull of Student's t interval and
               the interval that inverts the exact sign-flip test (``paired_interval``)
  sequential   the anytime-valid confidence sequence of the same mean (a scale-invariant Gaussian
               mixture, close to Wang & Ramdas 2023), valid at every number of seeds at once
  signs        the sign interval and sign confidence sequence of the MEDIAN difference: exact for
               any distribution (the verdicts' intervals since issue 33)
  rule         the one verdict rule every verdict goes through: the median's interval decides, the
               mean's is shown beside it with an outlier/skew flag; not tested; Tarone
  verdict      interval -> verdict (better / worse / equivalent within margin / not decided /
               cannot decide), the margin (absolute or % of the baseline) and the check that no
               verdict contradicts its interval
  families     which comparisons share an error rate, and the Bonferroni level of each interval
  waves        one wave of the sequential design: decided comparisons, and which variants get seeds
  costs        what a sweep spends: trials, core- and GPU-hours, measured per trial (scipy-free)
  reach        the seeds a comparison needs at the spread it shows (the margin's reach, the budget's
               projections)
  budget       the cost budget of the waves: each undecided comparison priced before a wave, and
               "inconclusive at budget" for one the budget cannot pay for
  runs         the finished per-seed values of a running sweep, from its MLflow child runs

Why each choice is made, and the simulations behind it, is in docs/STATISTICS.md and in the
tests (``tests/orchestrator/decide``).
"""
