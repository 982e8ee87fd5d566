"""The Python package in layers (docs/architecture.md "Layers"), read from the source, not run:
every import of every module under mnn_h2o/ (at the top or inside a function: a lazy import is
still a dependency) makes one edge of a graph, and that graph has no cycle; one module is the
door to the native core; bench and eval sit side by side, neither importing the other; imports
go down the layers docs/architecture.md lists, and that list is the one tested here."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from typing import Dict, List, Optional, Set

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "mnn_h2o"
CORE = "mnn_h2o._core"
# The modules that may import the native module: the door, and config.py, which sits below it and
# asks the native core, lazily (importing config needs no build), to check the cross-key rules that
# live only there.
CORE_DOORS = {"mnn_h2o.native", "mnn_h2o.config"}
# docs/architecture.md "Layers", bottom first: a module imports from its own layer or one below.
# A module's layer is that of the longest name here it is or is inside.
LAYERS = (
    ("the native module", ("mnn_h2o._core",)),
    ("base", ("mnn_h2o.errors", "mnn_h2o.config", "mnn_h2o.cli_errors", "mnn_h2o.cli_numbers")),
    ("native door", ("mnn_h2o.native",)),
    ("model and runtime", ("mnn_h2o",)),
    ("commands", ("mnn_h2o.demo", "mnn_h2o.chat", "mnn_h2o.prefill_progress", "mnn_h2o.bench", "mnn_h2o.eval",
                  "mnn_h2o.tools", "mnn_h2o.serve")),
)


def package_modules(root: str = ROOT) -> Dict[str, str]:
    """Dotted name -> path of every .py under mnn_h2o/ (a package's __init__.py is the package)."""
    found = {}
    for folder, dirs, files in os.walk(os.path.join(root, PACKAGE)):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")))
        rel = os.path.relpath(folder, root).split(os.sep)
        for f in sorted(files):
            if f.endswith(".py"):
                parts = rel if f == "__init__.py" else rel + [f[:-3]]
                found[".".join(parts)] = os.path.join(folder, f)
    return found


def _imported_names(path: str, module: str) -> List[str]:
    """The dotted names ``module``'s file imports, relative imports resolved: ``from X import a``
    gives X.a (a submodule, when one exists) and X."""
    is_package = os.path.basename(path) == "__init__.py"
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[:len(base) - node.level + (1 if is_package else 0)]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module
            names += [base] + [f"{base}.{a.name}" for a in node.names]
    return names


def import_graph(modules: Dict[str, str]) -> Dict[str, Set[str]]:
    """Module -> the package modules it imports (the native module counts as one: mnn_h2o._core).
    An imported name is mapped to the longest known module it names (``from .bench import x``:
    mnn_h2o.bench.x if that is a module, else mnn_h2o.bench); a module's imports of itself and of
    the package root (which only holds __version__) are left out."""
    known = set(modules) | {CORE}
    graph = {}
    for module, path in modules.items():
        edges = set()
        for name in _imported_names(path, module):
            if not (name == PACKAGE or name.startswith(PACKAGE + ".")):
                continue
            parts = name.split(".")
            while len(parts) > 1 and ".".join(parts) not in known:
                parts.pop()
            target = ".".join(parts)
            if target in known and target not in (module, PACKAGE):
                edges.add(target)
        graph[module] = edges
    return graph


def find_cycle(graph: Dict[str, Set[str]]) -> Optional[List[str]]:
    """One cycle of ``graph`` as [a, b, ..., a], or None (depth-first search, colours white /
    grey (on the current path) / black (done): an edge to a grey node closes a cycle)."""
    state: Dict[str, int] = {}
    path: List[str] = []

    def visit(node: str) -> Optional[List[str]]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def layer_of(module: str) -> int:
    """The index in LAYERS of ``module``'s layer."""
    best, depth = -1, -1
    for i, (_, names) in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and name.count(".") > depth:
                best, depth = i, name.count(".")
    return best


@pytest.fixture(scope="module")
def graph():
    return import_graph(package_modules())


# --- the cycle finder on graphs whose answer is known -------------------------------------------

def test_find_cycle_on_synthetic_graphs():
    assert find_cycle({}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    # A diamond is no cycle: d is reached twice, never from itself.
    assert find_cycle({"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": set()}) is None
    assert find_cycle({"a": {"a"}}) == ["a", "a"]
    assert find_cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    # The circle issue 37 found, behind an acyclic entry.
    cycle = find_cycle({"demo": {"cli_errors"}, "cli_errors": {"engine"}, "engine": {"export"},
                        "export": {"cli_errors"}})
    assert cycle == ["cli_errors", "engine", "export", "cli_errors"]


def test_a_planted_cycle_in_a_package_tree_is_found(tmp_path):
    """The whole path, files to graph to cycle, on a small package written here: relative and
    absolute imports, a lazy import inside a function, a package's __init__.py."""
    pkg = tmp_path / PACKAGE
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text('__version__ = "0"\n')
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "low.py").write_text("import os\n")
    (pkg / "mid.py").write_text("from . import low\nfrom .sub.top import helper\n")
    (pkg / "sub" / "top.py").write_text("def helper():\n    from ..mid import x\n    return x\n")
    (pkg / "sub" / "side.py").write_text("import mnn_h2o.low\nfrom mnn_h2o import _core\n")
    modules = package_modules(str(tmp_path))
    assert set(modules) == {"mnn_h2o", "mnn_h2o.sub", "mnn_h2o.low", "mnn_h2o.mid",
                            "mnn_h2o.sub.top", "mnn_h2o.sub.side"}
    g = import_graph(modules)
    assert g["mnn_h2o.mid"] == {"mnn_h2o.low", "mnn_h2o.sub.top"}
    assert g["mnn_h2o.sub.top"] == {"mnn_h2o.mid"}
    assert g["mnn_h2o.sub.side"] == {"mnn_h2o.low", CORE}
    assert find_cycle(g) == ["mnn_h2o.mid", "mnn_h2o.sub.top", "mnn_h2o.mid"]
    (pkg / "sub" / "top.py").write_text("def helper():\n    return 1\n")
    assert find_cycle(import_graph(package_modules(str(tmp_path)))) is None


# --- the package ----------------------------------------------------------------------------

def test_the_graph_sees_the_package(graph):
    """Guards the walk itself: known edges, lazy and relative ones included, are found."""
    assert graph["mnn_h2o.engine"] >= {"mnn_h2o.config", "mnn_h2o.native", "mnn_h2o.export"}
    assert "mnn_h2o.engine" in graph["mnn_h2o.bench.__main__"]  # inside a function, two dots up
    assert CORE in graph["mnn_h2o.native"]


def test_no_import_cycle(graph):
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_one_door_to_the_native_core(graph):
    importers = {m for m, edges in graph.items() if CORE in edges}
    assert importers <= CORE_DOORS, \
        f"only {sorted(CORE_DOORS)} import {CORE} (the others use mnn_h2o.native): {sorted(importers - CORE_DOORS)}"


def test_bench_and_eval_do_not_import_each_other(graph):
    def imports(src: str, dst: str) -> List[str]:
        return sorted(f"{m} -> {t}" for m, edges in graph.items() if m.startswith(src + ".")
                      for t in edges if t == dst or t.startswith(dst + "."))

    assert imports("mnn_h2o.bench", "mnn_h2o.eval") == []
    assert imports("mnn_h2o.eval", "mnn_h2o.bench") == []


def test_imports_go_down_the_layers(graph):
    upward = [f"{m} ({LAYERS[layer_of(m)][0]}) -> {t} ({LAYERS[layer_of(t)][0]})"
              for m, edges in sorted(graph.items()) for t in sorted(edges) if layer_of(t) > layer_of(m)]
    assert upward == [], "imports up the layers of docs/architecture.md: " + "; ".join(upward)


def test_layer_of():
    assert [layer_of(m) for m in ("mnn_h2o._core", "mnn_h2o.errors", "mnn_h2o.native", "mnn_h2o.engine",
                                  "mnn_h2o.demo", "mnn_h2o.bench.cases", "mnn_h2o.serve")] == [0, 1, 2, 3, 4, 4, 4]


def test_the_base_imports_nothing_above_it(graph):
    """errors.py imports nothing at all: any module may import it."""
    assert graph["mnn_h2o.errors"] == set()


def test_a_missing_build_is_one_clear_error():
    """Without the native module, what does not need it imports (the errors, exporting a model,
    measuring) and the door says how to build."""
    code = ("import sys\n"
            "sys.modules['mnn_h2o._core'] = None  # as if never built\n"
            "import mnn_h2o.errors, mnn_h2o.cli_errors, mnn_h2o.export, mnn_h2o.measure\n"
            "import mnn_h2o.native\n")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: mnn_h2o's native core (mnn_h2o._core) is not built"), p.stderr
    assert "docs/building.md" in last and "scripts/setup.sh" in last


def _documented_layers() -> Dict[str, List[str]]:
    """Layer name -> the names listed for it in docs/architecture.md "Layers"."""
    with open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8") as f:
        text = f.read()
    block = text[text.index("## Layers"):].split("```")[1]
    layers: Dict[str, List[str]] = {}
    label = None
    for line in block.strip("\n").splitlines():
        if line[:20].strip():
            label = line[:20].strip()
            layers[label] = []
        layers[label] += [n.strip() for n in line[20:].split(",") if n.strip()]
    return layers


def test_the_documented_layers_are_the_tested_ones(graph):
    documented = _documented_layers()
    assert list(documented) == [name for name, _ in reversed(LAYERS)]
    named = set()
    for label, names in documented.items():
        for n in names:
            module = n if n.startswith(PACKAGE + ".") else f"{PACKAGE}.{n.rstrip('/')}"
            assert LAYERS[layer_of(module)][0] == label, f"docs/architecture.md Layers puts {n} in {label}"
            named.add(module)
    # Every module at the top of the package, and every subpackage, is in the list.
    tops = {".".join(m.split(".")[:2]) for m in graph if m != PACKAGE}
    assert tops <= named, f"docs/architecture.md Layers leaves out {sorted(tops - named)}"
