"""The "paper vs this run" section: for a sweep that mirrors a paper result
(``orchestrator.report.paper.refs``), the paper's ordering and relative changes beside the measured
ones, and whether each direction agrees.

- Directions are compared as improvements (lower is better for perplexity and loss, higher for
  accuracy and scores, on each side separately), so a miniature that measures loss can be held
  against a paper table of benchmark scores. A paper row equal to its baseline has no direction.
- "agrees" compares the sign of the measured mean change, significant or not; the verdict
  column says whether this run could tell (``orchestrator.report.compare.verdicts``).
- The ordering line counts the pairs of variants (the baseline included) that the run orders as
  the paper does (pairs the paper ties are skipped) and gives Kendall's tau-b.
- Cost rows (Tables 15-17) show the paper's step-time, memory and parameter changes beside the
  measured ones; CPU timings of tiny models are not the paper's GPU kernels, so only the
  ordering is worth reading.
- Figure 6 is three claims checked on the per-depth comparisons; the router-LR result is a
  claim of no effect, checked on the omnibus tests and verdicts.
"""
from __future__ import annotations

import math
from itertools import combinations
from typing import Any

import numpy as np
from scipy import stats as sps

from orchestrator.core.fmt import cell_text, num, order_key, pct, table
from orchestrator.report.compare import verdicts
from orchestrator.report.compare.across_seeds import Comparison
from orchestrator.report.compare.results import PairedAnalysis
from orchestrator.report.paper.refs import PaperRef


def _sign(x: float) -> int:
    return 0 if x == 0 or x != x else (1 if x > 0 else -1)


def _verdict_of(pa: PairedAnalysis | None, value: Any) -> str:
    if pa is None or not pa.rows:
        return "-"
    try:
        return pa.row(value).verdict
    except KeyError:
        return verdicts.BASELINE if value == pa.baseline else "-"


def section(ref: PaperRef, comp: Comparison, pa: PairedAnalysis | None, rows: list[dict],
            by_depth: dict[Any, tuple[Comparison, PairedAnalysis | None]], mode: str) -> list[str]:
    """The markdown lines of the section (starting with its heading)."""
    lines = ["", "## Paper vs this run", "",
             f"Reference: {ref.title} of the paper (arXiv 2502.09245): {ref.setting}"
             + (f". The paper: {ref.statement}." if ref.statement else ".")
             + f" This run: `{comp.metric}`, {verdicts.direction_words(mode)}. Directions are compared as "
             "improvements over the baseline; at a different scale only directions and orderings can agree."]
    if ref.claim == "depth":
        return lines + _depth(by_depth, mode)
    if ref.claim == "no-effect":
        return lines + _no_effect(comp, pa)
    return lines + _table(ref, comp, pa, mode) + _cost(ref, comp, rows)


def _matched(ref: PaperRef, comp: Comparison) -> list[tuple[Any, Any]]:
    """(paper row, group summary) for the variants present in both, the baseline first."""
    out = [(ref.match(g.value), g) for g in comp.groups if g.n > 0 and ref.match(g.value) is not None]
    return out if out and out[0][0] is ref.rows[0] else []


def _table(ref: PaperRef, comp: Comparison, pa: PairedAnalysis | None, mode: str) -> list[str]:
    pairs = _matched(ref, comp)
    if len(pairs) < 2:
        return ["", f"No comparison: this run lacks the paper's baseline ({ref.rows[0].label}) or every other "
                "variant of the table (axis values are matched by name: "
                + ", ".join(f"{r.label} = {'/'.join(r.aliases)}" for r in ref.rows) + ")."]
    paper_sign = -1 if ref.lower_is_better else 1
    run_sign = -1 if mode == "min" else 1
    base_row, base_g = pairs[0]
    p_imp = {g.value: paper_sign * (r.value - base_row.value) for r, g in pairs}
    r_imp = {g.value: run_sign * (g.mean - base_g.mean) for r, g in pairs}
    p_rank = _ranks({g.value: paper_sign * r.value for r, g in pairs})
    r_rank = _ranks({g.value: run_sign * g.mean for r, g in pairs})
    body, agree, total = [], 0, 0
    for r, g in pairs:
        is_base = r is base_row
        ps, rs = _sign(p_imp[g.value]), _sign(r_imp[g.value])
        ok = "-" if is_base or ps == 0 else ("yes" if ps == rs else "no")
        agree, total = agree + (ok == "yes"), total + (ok != "-")
        body.append([f"{cell_text(g.value)} ({r.label})", num(r.value), "(baseline)" if is_base else
                     pct(100 * (r.value - base_row.value) / abs(base_row.value)), str(p_rank[g.value]),
                     num(g.mean, 4), "(baseline)" if is_base else pct(g.change_pct), str(r_rank[g.value]),
                     _verdict_of(pa, g.value), ok])
    lines = ["", *table(["variant", "paper", "paper change", "paper rank", "this run (mean)", "change", "rank",
                         "verdict", "direction agrees"], body), ""]
    lines.append(f"- Directions: {agree} of {total} variants move the way the paper's do"
                 + (f"; significant here: {_significant(pa, [g.value for _, g in pairs[1:]], p_imp)}." if pa
                    and pa.rows else "."))
    lines.append(_ordering([g.value for _, g in pairs], p_imp, r_imp))
    missing = [r.label for r in ref.rows if not any(pr is r for pr, _ in pairs)]
    if missing:
        lines.append(f"- In the paper's table but not in this run: {', '.join(missing)}.")
    return lines


def _ranks(score: dict[Any, float]) -> dict[Any, int]:
    """1 = best (largest improvement score); ties share the better rank."""
    vals = sorted(score.values(), reverse=True)
    return {k: vals.index(v) + 1 for k, v in score.items()}


def _significant(pa: PairedAnalysis, values: list, p_imp: dict) -> str:
    found = []
    for v in values:
        verdict = _verdict_of(pa, v)
        if verdict in (verdicts.BETTER, verdicts.WORSE):
            same = (verdict == verdicts.BETTER) == (p_imp[v] > 0)
            found.append(f"{cell_text(v)} {verdict} ({'as in' if same and p_imp[v] else 'unlike'} the paper)")
    return ", ".join(found) if found else "none"


def _ordering(values: list, p_imp: dict, r_imp: dict) -> str:
    conc = comparable = 0
    for a, b in combinations(values, 2):
        ps = _sign(p_imp[a] - p_imp[b])
        if ps == 0:
            continue
        comparable += 1
        conc += ps == _sign(r_imp[a] - r_imp[b])
    tau = (sps.kendalltau([p_imp[v] for v in values], [r_imp[v] for v in values]).statistic
           if len(values) > 2 else math.nan)
    return (f"- Ordering: {conc} of {comparable} pairs of variants are ordered as in the paper"
            + (f" (Kendall's tau-b {num(float(tau), 3, 'nan')})." if len(values) > 2 else "."))


def _cost(ref: PaperRef, comp: Comparison, rows: list[dict]) -> list[str]:
    costed = [(r, row) for row in rows for r in [ref.match(row["variant"])] if r is not None and r.cost]
    if not costed:
        return []
    cols = [("params", "params_change_pct", "params"), ("step time", "step_time_change_pct", "step_time"),
            ("peak memory", "peak_mem_change_pct", "peak_mem")]
    cols = [c for c in cols if any(c[2] in r.cost for r, _ in costed)]
    body = [[f"{cell_text(row['variant'])} ({r.label})"]
            + [x for _, col, key in cols for x in (pct(r.cost.get(key, math.nan)), pct(row[col]))]
            for r, row in costed]
    header = ["variant"] + [x for name, _, _ in cols for x in (f"paper {name}", f"this run {name}")]
    return ["", "Cost vs the baseline (the paper's GPU measurements beside this run's; CPU timings of small "
            "models rank the variants at best):", "", *table(header, body)]


def _depth(by_depth: dict[Any, tuple[Comparison, PairedAnalysis | None]], mode: str) -> list[str]:
    run_sign = -1 if mode == "min" else 1
    got = {}
    for depth, (c, pa) in by_depth.items():
        llama = next((g for g in c.groups if str(g.value).lower() in ("none", "llama") and g.n), None)
        lime = next((g for g in c.groups if str(g.value).lower() in ("full", "lime") and g.n), None)
        if depth is not None and llama and lime:
            got[depth] = (llama, lime, _verdict_of(pa, lime.value))
    if not got:
        return ["", "No comparison: the run has no depth with both `none` and `full` finished."]
    depths = sorted(got, key=order_key)
    body, wins = [], 0
    for d in depths:
        llama, lime, v = got[d]
        win = run_sign * (lime.mean - llama.mean) > 0
        wins += win
        body.append([cell_text(d), num(llama.mean, 4), num(lime.mean, 4), pct(lime.change_pct), v,
                     "yes" if win else "no"])
    gains = [run_sign * got[d][1].change_pct for d in depths]  # improvement in %
    grows = all(b > a for a, b in zip(gains, gains[1:])) if len(gains) > 1 else None
    lines = ["", *table(["n_layers", "none (mean)", "full (mean)", "full vs none", "verdict", "LIMe ahead"], body),
             "", f"- LIMe ahead at every depth: {'yes' if wins == len(depths) else 'no'} ({wins} of {len(depths)}).",
             "- Advantage larger at each greater depth, by the means (a description, not a verdict: the verdicts "
             "per depth are the table's): " + ("not measurable (one depth)." if grows is None else
                                               f"{'yes' if grows else 'no'} (improvement "
                                               + ", ".join(f"{g:.2f}%" for g in gains) + ").")]
    cross = [(d, 2 * d) for d in depths if 2 * d in got]
    for d, d2 in cross:
        ahead = run_sign * (got[d][1].mean - got[d2][0].mean) > 0
        lines.append(f"- {d}-layer LIMe vs {d2}-layer LLaMA (the paper: 64 beats 128): {num(got[d][1].mean, 4)} vs "
                     f"{num(got[d2][0].mean, 4)}, LIMe {'ahead' if ahead else 'behind'} "
                     f"({'agrees' if ahead else 'disagrees'}).")
    return lines


def _no_effect(comp: Comparison, pa: PairedAnalysis | None) -> list[str]:
    o = comp.omnibus
    kw = o.perm_p if o.perm_method else o.p
    fr = pa.friedman if pa is not None else None
    omni = fr.perm_p if fr is not None and fr.status == "ok" else kw
    name = "Friedman (paired)" if fr is not None and fr.status == "ok" else "Kruskal-Wallis"
    decided = [r for r in (pa.rows if pa else []) if r.verdict in (verdicts.BETTER, verdicts.WORSE)]
    agrees = (omni != omni or omni >= comp.alpha) and not decided
    lines = ["", f"- Kruskal-Wallis here: p = {num(kw, 4, 'nan')}"
             + (f" ({o.perm_method} permutation)" if o.perm_method else "") + "; the paper: p = 0.06564.",
             f"- {name} p = {num(omni, 4, 'nan')}; variants better or worse than the baseline: "
             + (", ".join(f"{cell_text(r.variant)} {r.verdict}" for r in decided) if decided else "none") + ".",
             f"- No effect, as in the paper: {'yes' if agrees else 'no'}."]
    mins = [r.min_p_holm for r in (pa.rows if pa else [])]
    if mins and np.min(mins) >= comp.alpha:
        lines.append("- This design cannot reach significance at all, so its agreement says nothing.")
    return lines
