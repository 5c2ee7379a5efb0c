"""Sweep reports from MLflow alone (no torch, no Ray, no sweep layer): runs -> statistics -> files.

  runs         a sweep's MLflow runs -> one pandas row per trial (``SweepRuns``)
  settings     what a report compares (``Choice``) and the sweep file it shows
  stats/       pure statistics on arrays (paired, ranks, intervals, multiplicity, power)
  compare/     the runs frame -> comparison results (across seeds, by seed, verdicts, tuning)
  scaling/     scaling fits, the depth view and the iso-FLOP comparison of size ladders
  paper/       the paper's results as data and the "paper vs this run" section
  render/      markdown sections, tables, figures and report.html
  search       search sweeps: the sampled configurations are what is compared
  efficiency   how well a sweep used its slots
  multiplier/  compute multipliers: the FLOPs the baseline needs to reach a variant's loss over its own
  wallclock/   wall-clock speedups: the multiplier times a throughput ratio measured by ``lime report
               --throughput`` (torch passed in by the CLI: this layer stays torch-free)
  planner      the seed planner (``lime plan``)
  build        the assembly: ``build_report`` writes results/<sweep>/ and logs it to the parent run
"""
