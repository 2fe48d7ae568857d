"""The library's layers run one way (docs/design.rst): cli → tools → models → fast paths → kernels → data → runtime.

Parsed from the source, every import counted (at module level and inside functions alike: a deferred import is
still a dependency): a module imports only modules of its own layer or below, no two modules import each other
through any chain, nothing outside ``nmtkit.cli`` imports it or click, and every module has a layer (a new one must
be placed in ``LAYERS`` below, which is the layering's one statement in code).
"""

from __future__ import annotations

import ast
from fnmatch import fnmatchcase
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "nmtkit"

# Bottom first.  A module belongs to the layer that names it exactly, else to the first layer one of whose patterns
# matches its dotted name.
LAYERS: list[tuple[str, list[str]]] = [
    ("runtime", ["nmtkit", "nmtkit.errors", "nmtkit.runtime", "nmtkit.files", "nmtkit.progress", "nmtkit.parallel",
                 "nmtkit.streaming", "nmtkit.device", "nmtkit.threads", "nmtkit.settings"]),
    ("data", ["nmtkit.data", "nmtkit.data.*", "nmtkit.datasets", "nmtkit.datasets.catalogue",
              "nmtkit.datasets.content", "nmtkit.datasets.download", "nmtkit.datasets.fetch",
              "nmtkit.datasets.hansards"]),
    ("kernels", ["nmtkit.kernels", "nmtkit.kernels.*"]),
    ("fast paths", ["nmtkit.models.fast", "nmtkit.models.fast.*"]),
    # (the fast backend lives with the fast paths it composes, but as a Backend of the models it is of their layer)
    ("models", ["nmtkit.models", "nmtkit.models.*", "nmtkit.models.fast.backend"]),
    ("tools", ["nmtkit.prepare", "nmtkit.prepare.*", "nmtkit.select", "nmtkit.select.*", "nmtkit.train", "nmtkit.train.*",
               "nmtkit.translate", "nmtkit.translate.*", "nmtkit.align", "nmtkit.posterior", "nmtkit.symmetrize",
               "nmtkit.score",
               "nmtkit.score.*", "nmtkit.plots",
               "nmtkit.serve", "nmtkit.serve.*"]),
    ("cli", ["nmtkit.cli", "nmtkit.cli.*", "nmtkit.*.__main__"]),  # (a package's __main__ is a launcher, as bin/)
]


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def layer_of(name: str) -> int | None:
    for rank, (_, patterns) in enumerate(LAYERS):
        if name in patterns:
            return rank
    for rank, (_, patterns) in enumerate(LAYERS):
        if any(fnmatchcase(name, p) for p in patterns):
            return rank
    return None


def _imports(name: str, path: Path) -> set[str]:
    """The nmtkit modules ``name`` imports: ``from pkg import sub`` counts as an import of ``pkg.sub`` when that is a
    module (the package's own ``__init__`` runs first either way, as for every import of a submodule)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            subs = {f"{module}.{a.name}" for a in node.names} & MODULES.keys()
            found |= subs or {module}
            if len(subs) < len(node.names):
                found.add(module)
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def test_every_module_has_a_layer():
    unplaced = sorted(name for name in MODULES if layer_of(name) is None)
    assert not unplaced, f"place these modules in a layer of tests/test_layers.py: {unplaced}"


def test_imports_go_down_or_across_never_up():
    upward = [f"{a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})"
              for a, deps in GRAPH.items() for b in deps
              if layer_of(a) is not None and layer_of(b) is not None and layer_of(b) > layer_of(a)]
    assert not upward, "\n".join(sorted(upward))


def test_no_import_cycles():
    # Tarjan's strongly connected components: any component of more than one module is a cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert not cycles, f"modules that import each other: {cycles}"


def test_the_library_never_imports_its_command_line():
    cli = LAYERS.index(next(layer for layer in LAYERS if layer[0] == "cli"))
    offenders = sorted(a for a, deps in GRAPH.items() if layer_of(a) != cli
                       and any(b == "nmtkit.cli" or b.startswith("nmtkit.cli.") for b in deps))
    assert not offenders, f"library modules importing nmtkit.cli: {offenders}"
    uses_click = sorted(name for name, path in MODULES.items() if layer_of(name) != cli
                        and any(isinstance(n, (ast.Import, ast.ImportFrom))
                                and any((getattr(n, "module", None) or a.name).split(".")[0] == "click"
                                        for a in n.names)
                                for n in ast.walk(ast.parse(path.read_text()))))
    assert not uses_click, f"library modules importing click: {uses_click}"


@pytest.mark.parametrize("bad, reason", [
    ({"nmtkit.data.vocab": {"nmtkit.models"}}, "imports go down"),
    ({"nmtkit.translate.translator": {"nmtkit.translate.pool"},
      "nmtkit.translate.pool": {"nmtkit.translate.translator"}}, "no cycles"),
])
def test_the_checks_catch_what_they_are_for(monkeypatch, bad, reason):
    # The checks above run on the real graph; here each is shown failing on a graph with one planted violation.
    for module, deps in bad.items():
        monkeypatch.setitem(GRAPH, module, GRAPH[module] | deps)
    check = test_imports_go_down_or_across_never_up if reason == "imports go down" else test_no_import_cycles
    with pytest.raises(AssertionError):
        check()


def test_the_benchmark_table_names_every_script_and_only_files_that_exist():
    # tests/bench/README.md is where a reader finds which script measures what; it must not drift from the folder.
    import re

    bench = ROOT.parent / "tests" / "bench"
    text = (bench / "README.md").read_text()
    scripts = {p.name for p in bench.glob("*.py")} - {"peers.py"}
    listed = set(re.findall(r"^\| `([\w.]+\.py)` \|", text, re.M))
    assert listed == scripts, f"listed but absent: {sorted(listed - scripts)}; absent from the table: " \
                              f"{sorted(scripts - listed)}"
    named = set(re.findall(r"`(bench_[\w-]+\.txt|soak_\w+\.txt)`", text))
    missing = sorted(n for n in named if not (bench / "results" / n).is_file())
    assert named and not missing, f"result files the table names that do not exist: {missing}"
    modules = set(re.findall(r"`(nmtkit/[\w/]+\.(?:py|c))`", text))
    gone = sorted(m for m in modules if not (ROOT.parent / m).is_file())
    assert modules and not gone, f"modules the table names that do not exist: {gone}"
