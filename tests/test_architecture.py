"""The layering of docs/ARCHITECTURE.md, enforced: which package may import which, no import
cycles, no project imports hidden inside functions, torch-free layers stay torch-free, and no
module grows past the size a reader can hold in mind."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ("lime_arch", "orchestrator")

# layer -> the layers it may import (besides itself). The model library is at the bottom and
# knows nothing of the orchestrator; cli is at the top and may use everything.
ALLOWED = {
    "model": set(),
    "core": {"model.errors"},
    "tasks": {"core", "model.errors", "model.specs"},
    "analysis": {"core", "model"},
    "engine": {"core", "tasks", "analysis", "model"},
    "evaluation": {"core", "engine", "tasks", "model"},
    "export": {"core", "engine", "evaluation", "model"},
    # decide: the benchmark's paired rounds stop on the project's sign confidence sequence (decide.signs)
    "bench": {"core", "model", "decide"},
    "decide": {"core", "model.errors"},
    "sweep": {"core", "decide", "engine", "evaluation", "tasks", "model"},
    "report": {"core", "decide", "analysis.torchfree", "model.errors"},
    "cli": {"core", "tasks", "analysis", "engine", "evaluation", "export", "bench", "decide", "sweep", "report",
            "model"},
}
# What validates a sweep file or a trial config, and the CLI modules that do it before loading the
# heavy parts: no torch, Ray, MLflow, scipy or pandas (a refusal is one line in a fraction of a
# second). The routers' and depth mixes' declarations, the data sources' checks, the trial config,
# the sweep format.
VALIDATION = ("lime_arch.config", "lime_arch.routers", "lime_arch.router_base", "lime_arch.depth_mix.registry",
              "lime_arch.depth_mix.peers", "lime_arch.depth_mix.mhc", "lime_arch.depth_mix.attn_res",
              "lime_arch.depth_mix.mudd", "orchestrator.engine.trial_config", "orchestrator.engine.sources",
              "orchestrator.engine.taskspec", "orchestrator.sweep.files", "orchestrator.sweep.checks",
              "orchestrator.sweep.blocks", "orchestrator.sweep.schema", "orchestrator.sweep.spec",
              "orchestrator.cli.sweep", "orchestrator.cli.train", "orchestrator.cli.plan", "orchestrator.cli.report")
TORCH_FREE = ("orchestrator.core", "orchestrator.decide", "orchestrator.report", "orchestrator.analysis.metrics",
              "orchestrator.analysis.plots", "orchestrator.tasks", "lime_arch.errors", "lime_arch.specs",
              "lime_arch.size", "orchestrator.cli.bench",
              "orchestrator.bench.shapes", "orchestrator.bench.targets",
              "orchestrator.bench.outputs", "orchestrator.bench.stopping",
              "orchestrator.evaluation.suites", "orchestrator.evaluation.settings",
              *VALIDATION)
MAX_LINES = 400


def _modules() -> dict[str, Path]:
    out = {}
    for top in PROJECT:
        for p in sorted((ROOT / top).rglob("*.py")):
            parts = list(p.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = p
    return out


MODULES = _modules()


def layer(mod: str) -> str:
    if mod.startswith("lime_arch"):
        return "model"
    return mod.split(".")[1] if mod.count(".") >= 1 else "orchestrator"


def _resolve(node: ast.ImportFrom, mod: str, is_pkg: bool) -> str:
    if not node.level:
        return node.module or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _project_target(name: str) -> str | None:
    """The project module an import names (a submodule if ``from pkg import submodule``)."""
    if name.split(".")[0] not in PROJECT:
        return None
    while name and name not in MODULES:
        name = name.rsplit(".", 1)[0] if "." in name else ""
    return name or None


# a string that names a project module (``"orchestrator.sweep.driver"``, ``"pkg.mod:attr"``) is loaded
# by name somewhere: importlib.import_module, a lazy command table, a declaration's implementation
MODULE_STRING = re.compile(r"^((?:lime_arch|orchestrator)(?:\.\w+)*)(?::\w+)?$")
# modules whose import_module reads a name written in another module, where the test sees it
NAMED_ELSEWHERE = {"lime_arch.specs": "a declaration's `implementation = 'module:Base'`, in the declaring module"}


def imports_of(mod: str, source: str, is_pkg: bool) -> list[tuple[str, int, str]]:
    """(target module, line, how) for every project import in ``source`` of module ``mod``; how is
    "top" (an import statement at module level), "function" (one inside a function) or "string"
    (a string naming a project module: the lazy path of ``importlib.import_module``)."""
    tree = ast.parse(source)
    out = []

    def visit(node, in_func):
        for child in ast.iter_child_nodes(node):
            f = in_func or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            how = "function" if f else "top"
            if isinstance(child, ast.Import):
                for a in child.names:
                    t = _project_target(a.name)
                    if t:
                        out.append((t, child.lineno, how))
            elif isinstance(child, ast.ImportFrom):
                src = _resolve(child, mod, is_pkg)
                for a in child.names:
                    t = _project_target(f"{src}.{a.name}") or _project_target(src)
                    if t:
                        out.append((t, child.lineno, how))
            elif isinstance(child, ast.Constant) and isinstance(child.value, str):
                m = MODULE_STRING.match(child.value)
                t = _project_target(m.group(1)) if m else None
                if t:
                    out.append((t, child.lineno, "string"))
            visit(child, f)

    visit(tree, False)
    return out


def imports(mod: str) -> list[tuple[str, int, str]]:
    path = MODULES[mod]
    return imports_of(mod, path.read_text(), path.name == "__init__.py")


def unseen_string_imports(source: str) -> list[int]:
    """Lines of ``importlib.import_module(x)`` calls whose module this test cannot read: x is
    neither a string literal, nor an f-string under the module's own ``__name__``, nor a name whose
    values are the module's own project-module strings (a table such as ``_EXPORTS``)."""
    tree = ast.parse(source)
    has_names = any(isinstance(n, ast.Constant) and isinstance(n.value, str) and MODULE_STRING.match(n.value)
                    for n in ast.walk(tree))
    bad = []
    for n in ast.walk(tree):
        if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "import_module"
                and n.args):
            continue
        arg = n.args[0]
        if isinstance(arg, ast.Constant):
            continue
        if (isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.FormattedValue)
                and isinstance(arg.values[0].value, ast.Name) and arg.values[0].value.id == "__name__"):
            continue  # the module's own submodules: the same layer
        if isinstance(arg, (ast.Name, ast.Subscript, ast.Attribute)) and has_names:
            continue
        bad.append(n.lineno)
    return bad


def _edge_ok(src: str, dst: str) -> bool:
    ls, ld = layer(src), layer(dst)
    if ls == ld or ld == "orchestrator":
        return True
    allowed = ALLOWED[ls]
    if ld in allowed:
        return True
    # "model.errors", "model.specs": just that torch-free module of the model library
    if ld == "model" and dst.startswith("lime_arch.") and "model." + dst[len("lime_arch."):] in allowed:
        return True
    torch_free_analysis = ("orchestrator.analysis", "orchestrator.analysis.metrics", "orchestrator.analysis.plots")
    return ld == "analysis" and "analysis.torchfree" in allowed and dst in torch_free_analysis


def test_every_import_follows_the_layering():
    bad = [f"{src} -> {dst} (line {line}): {layer(src)} may not import {layer(dst)}"
           for src in MODULES for dst, line, _ in imports(src) if not _edge_ok(src, dst)]
    assert not bad, "\n".join(bad)


def test_no_project_import_inside_a_function():
    bad = [f"{src}:{line} imports {dst} inside a function"
           for src in MODULES for dst, line, how in imports(src) if how == "function"]
    assert not bad, "\n".join(bad)


def test_every_string_import_is_seen():
    # what importlib.import_module loads must be a string this test reads (above), else a lazy
    # import could cross the layering unseen
    bad = [f"{m}:{line}: importlib.import_module of a module this test cannot name"
           for m, p in MODULES.items() if m not in NAMED_ELSEWHERE for line in unseen_string_imports(p.read_text())]
    assert not bad, "\n".join(bad)


def test_no_import_cycle():
    # import statements only: a lazy import by name is how a cycle of use is allowed (a package's
    # table of lazy names, a declaration naming its implementation)
    graph = {m: sorted({d for d, _, how in imports(m) if d != m and how != "string"}) for m in MODULES}
    # a package's __init__ importing its own submodules is how packages work, not a cycle
    for m, deps in graph.items():
        graph[m] = [d for d in deps if not (MODULES[m].name == "__init__.py" and d.startswith(m + "."))]
    seen, stack, cycles = {}, [], []

    def dfs(m):
        seen[m] = 1
        stack.append(m)
        for d in graph.get(m, []):
            if seen.get(d) == 1:
                cycles.append(" -> ".join(stack[stack.index(d):] + [d]))
            elif d not in seen:
                dfs(d)
        stack.pop()
        seen[m] = 2

    for m in sorted(graph):
        if m not in seen:
            dfs(m)
    assert not cycles, "\n".join(cycles)


def test_modules_stay_readable():
    big = [f"{m}: {n} lines" for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > MAX_LINES]
    assert not big, "\n".join(big)


def _heavy_imports(mod: str, heavy: tuple[str, ...]) -> str:
    """Which of ``heavy`` are in sys.modules after importing ``mod`` (and its subpackages) in a
    fresh interpreter."""
    code = (f"import sys, importlib, pkgutil; m = importlib.import_module({mod!r}); "
            "subs = pkgutil.walk_packages(getattr(m, '__path__', []), m.__name__ + '.'); "
            "[importlib.import_module(x.name) for x in subs]; "
            f"print(sorted(k for k in {heavy!r} if k in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.parametrize("mod", TORCH_FREE)
def test_torch_free_layers_do_not_import_torch_or_ray(mod):
    # the validation modules may import the torch-free modules of the engine and sweep layers
    heavy = ("torch", "ray", "lm_eval", "transformers") + (() if mod in VALIDATION else
                                                            ("orchestrator.sweep", "orchestrator.engine"))
    assert _heavy_imports(mod, heavy) == "[]", f"{mod} pulls in {_heavy_imports(mod, heavy)}"


@pytest.mark.parametrize("mod", VALIDATION)
def test_validation_imports_no_heavy_library(mod):
    heavy = ("torch", "ray", "mlflow", "scipy", "pandas", "statsmodels", "matplotlib", "datasets", "tokenizers",
             "lm_eval", "transformers")
    assert _heavy_imports(mod, heavy) == "[]", f"{mod} pulls in {_heavy_imports(mod, heavy)}"


def test_the_layering_test_sees_a_forbidden_edge(tmp_path):
    # the checks above are only worth something if they can fail
    assert not _edge_ok("lime_arch.model", "orchestrator.engine.trial")
    assert not _edge_ok("orchestrator.report.build", "orchestrator.sweep.spec")
    assert not _edge_ok("orchestrator.engine.trial", "orchestrator.sweep.driver")
    assert _edge_ok("orchestrator.sweep.driver", "orchestrator.engine.trial")
    assert _edge_ok("orchestrator.report.build", "lime_arch.errors")
    assert not _edge_ok("orchestrator.report.build", "lime_arch.model")
    assert _edge_ok("orchestrator.tasks.base", "lime_arch.specs")
    assert not _edge_ok("orchestrator.report.build", "lime_arch.specs")
    assert not _edge_ok("orchestrator.tasks.base", "lime_arch.routers")
    assert not _edge_ok("orchestrator.decide.waves", "orchestrator.report.build")
    assert not _edge_ok("orchestrator.decide.waves", "orchestrator.sweep.driver")
    # a lazy import by name is an edge too, and one the test cannot name is reported
    lazy = ("import importlib\n\n\ndef build():\n"
            "    return importlib.import_module(\"orchestrator.sweep.driver\")\n")
    assert imports_of("orchestrator.report.build", lazy, False) == [("orchestrator.sweep.driver", 5, "string")]
    table = 'import importlib\n_LAZY = {"run": "orchestrator.sweep.driver:run"}\n'
    assert imports_of("orchestrator.report.build", table, False) == [("orchestrator.sweep.driver", 2, "string")]
    assert unseen_string_imports("import importlib\n\n\ndef f(m):\n    return importlib.import_module(m)\n") == [5]
    assert unseen_string_imports(lazy) == []
