"""Downstream evaluation of trained models with the LM Evaluation Harness (``lm-eval`` 0.4.x).

- ``settings``: ``EvalSettings``, what to evaluate (the sweep file's ``eval:`` block, the flags of
  ``lime eval``); torch-free.
- ``suites``: the paper's task suites by name (``paper-table-1``, ``paper-glue``, ``paper-qa``,
  ``paper-360m``) and the local ones; torch-free.
- ``loading``: a trained checkpoint -> model and the trial's own tokenizer.
- ``adapter``: ``LimeLM``, the harness's model interface over this project's models
  (``loglikelihood``, ``loglikelihood_rolling``, ``generate_until``); ``generation``: batched
  greedy decoding with the KV cache and stop sequences.
- ``localtasks``: the task definitions this project generates (KV retrieval, induction copy, a
  cloze task of the built-in corpus) as harness YAML tasks with local JSON data.
- ``variants``: the gold answer's bits-per-byte and loss of every multiple-choice task.
- ``checks``: the requested tasks resolved and their data found (the hub only when reachable)
  before any compute; ``harness``: runs the harness and turns its results into metrics;
  ``record``: the metrics, tags and the harness's JSON on the trial's MLflow run.

The harness and transformers load only inside the evaluation code paths (they are slow to
import): ``lime --help`` and sweep-file validation import this package's torch-free modules only.
"""
