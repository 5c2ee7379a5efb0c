"""What a report looks like: ``sections`` (the markdown, section by section, from ``ReportData``),
``tables`` (the results and per-cell tables), ``comparisons`` (markdown of the comparison
results), ``figures`` (PNG plots), ``html`` (the self-contained report.html)."""
