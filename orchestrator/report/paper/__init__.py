"""The paper's results as data (``refs``: one ``PaperRef`` per table or claim) and their comparison
with a sweep (``fidelity``: the report's "paper vs this run" section)."""
