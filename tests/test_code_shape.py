"""The shape of the code (issue 25), checked statically with `ast` over terminal_rsi/:

1. no cycle among the module-level imports between files;
2. no cycle between packages (`terminal_rsi.<pkg>` is one node; a top-level module such as
   `terminal_rsi/settings.py` is a node of its own; a package importing its own modules is
   fine);
3. the imports of `terminal_rsi` inside functions are exactly `IN_FUNCTION_IMPORTS` below
   (each with its reason: the list only shrinks);
4. no function over `MAX_LINES` lines in rpr/, pipeline/, rsr/, agent/ except `LONG_FUNCTIONS`;
5. below the top layer (`TOP_LAYER`: the config layer, the config files, the pipeline, the
   experiments and the report), no module imports the config layer (`CONFIG_LAYER`) or
   plotting (`PLOTTING`), at module level or inside a function;
6. the packages stand in the named layers of `LAYERS`, bottom up: every package and top-level
   module is in exactly one layer, and each imports only packages of lower layers.

The last tests run the same checks on a small synthetic package, so a check that finds
nothing is known to be able to find something.
"""

from __future__ import annotations

import ast
import collections
import pathlib
from collections.abc import Iterator, Mapping

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = "terminal_rsi"
MAX_LINES = 80
SHORT_PACKAGES = ("rpr", "pipeline", "rsr", "agent")
TOP_LAYER = ("config.configuration", "config.registry", "config.configdoc", "pipeline",
             "experiments", "report", "configs")
CONFIG_LAYER = ("ml_collections", "terminal_rsi.config.configuration",
                "terminal_rsi.config.registry", "terminal_rsi.config.configdoc",
                "terminal_rsi.pipeline", "terminal_rsi.experiments")
PLOTTING = ("matplotlib",)

# The packages of terminal_rsi (and its one top-level module), bottom layer first. A package
# imports only packages of lower layers; a new package or top-level module is placed here.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("settings",),                          # the typed-setting mechanism (Section, setting)
    ("runtime", "sandbox", "credit"),       # infrastructure, sandboxes, credit assignment math
    ("models", "rewards"),                  # models, samplers, weights; verifiers and rewards
    ("config", "training", "tasks"),        # typed sections; training math; task families
    ("agent",),                             # harness, episodes, the rollout engine
    ("rsr", "rpr", "evaluation"),           # the stages and the held-out evaluation
    ("pipeline",),                          # the recipe: stages, handoffs, validation
    ("report",),                            # figures and tables of a finished run
    ("experiments",),                       # the command-line entry points
    ("configs",),                           # the config files
)


# (module, innermost function) -> why a terminal_rsi import stays inside that function.
IN_FUNCTION_IMPORTS: dict[tuple[str, str], str] = {}

# (module, function) -> why it may exceed MAX_LINES (rpr/, pipeline/, rsr/, agent/ only).
LONG_FUNCTIONS: dict[tuple[str, str], str] = {}


# ----------------------------------------------------------------------------- the checker


def module_files(root: pathlib.Path, package: str = PACKAGE) -> dict[str, pathlib.Path]:
    """Dotted module name -> file, for every .py file under `root / package`."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool,
             modules: Mapping[str, pathlib.Path]) -> list[str]:
    """The known modules an import statement loads (a name imported from a package is the
    submodule when one has that name, else the package)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            pkg = module if is_package else module.rpartition(".")[0]
            parts = pkg.split(".")[:len(pkg.split(".")) - node.level + 1]
            base = ".".join(parts + ([base] if base else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                 for a in node.names]
    out = []
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name:
            out.append(name)
    return out


def _module_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements run at import time: the body, into if/else and try blocks."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _module_level(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            yield from _module_level(node.body + node.orelse + node.finalbody
                                     + [s for h in node.handlers for s in h.body])


class _FunctionImports(ast.NodeVisitor):
    """(innermost enclosing function, import node) for each import inside a function."""

    def __init__(self):
        self.stack: list[str] = []
        self.found: list[tuple[str, ast.Import | ast.ImportFrom]] = []

    def _function(self, node):
        self.stack.append(node.name)
        self.generic_visit(node)
        self.stack.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def visit_Import(self, node):
        if self.stack:
            self.found.append((self.stack[-1], node))

    visit_ImportFrom = visit_Import


class CodeShape:
    """Import graph, in-function imports and function lengths of a package's source."""

    def __init__(self, root: pathlib.Path, package: str = PACKAGE):
        self.package = package
        self.modules = module_files(root, package)
        self.edges: dict[str, set[str]] = collections.defaultdict(set)
        self.in_function: dict[tuple[str, str], set[str]] = collections.defaultdict(set)
        self.lengths: dict[tuple[str, str], int] = {}
        for module, path in self.modules.items():
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            is_package = path.name == "__init__.py"
            for node in _module_level(tree.body):
                if isinstance(node, ast.Import | ast.ImportFrom):
                    self.edges[module].update(
                        t for t in _targets(node, module, is_package, self.modules)
                        if t != module)
            visitor = _FunctionImports()
            visitor.visit(tree)
            for function, node in visitor.found:
                targets = _targets(node, module, is_package, self.modules)
                if targets:
                    self.in_function[(module, function)].update(targets)
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    n = node.end_lineno - node.lineno + 1
                    key = (module, node.name)
                    self.lengths[key] = max(n, self.lengths.get(key, 0))

    def package_of(self, module: str) -> str:
        """`package.<sub>` for a module in a subpackage; a top-level module is its own node."""
        parts = module.split(".")
        if len(parts) > 2 or (len(parts) == 2 and self.modules[module].name == "__init__.py"):
            return ".".join(parts[:2])
        return module

    def package_edges(self) -> dict[str, set[str]]:
        """{package or top-level module: the other packages it imports}."""
        edges: dict[str, set[str]] = collections.defaultdict(set)
        for a, targets in self.edges.items():
            for b in targets:
                pa, pb = self.package_of(a), self.package_of(b)
                if pa != pb:
                    edges[pa].add(pb)
        return edges

    def layer_problems(self, layers=LAYERS) -> list[str]:
        """What breaks `layers`: a package (or top-level module) in no layer or in two, a
        layer naming nothing that exists, and each import of a package at the same or a
        higher layer."""
        level = {}
        problems = []
        for i, layer in enumerate(layers):
            for name in layer:
                node = f"{self.package}.{name}"
                if node in level:
                    problems.append(f"{name} is in two layers")
                level[node] = i
        nodes = {self.package_of(m) for m in self.modules} - {self.package}
        problems += [f"{n.partition('.')[2]} is in no layer" for n in sorted(nodes - set(level))]
        problems += [f"{n.partition('.')[2]} does not exist" for n in sorted(set(level) - nodes)]
        for a, targets in sorted(self.package_edges().items()):
            for b in sorted(targets):
                if a in level and b in level and level[b] >= level[a]:
                    problems.append(f"{a} (layer {level[a]}) imports {b} (layer {level[b]})")
        return problems

    def file_cycles(self) -> list[list[str]]:
        return strongly_connected(self.edges)

    def package_cycles(self) -> list[list[str]]:
        return strongly_connected(self.package_edges())

    def long_functions(self, subpackages=SHORT_PACKAGES,
                       max_lines: int = MAX_LINES) -> dict[tuple[str, str], int]:
        prefixes = tuple(f"{self.package}.{p}." for p in subpackages)
        return {k: n for k, n in self.lengths.items()
                if n > max_lines and (k[0] + ".").startswith(prefixes)}


def layer_violations(root: pathlib.Path, package: str = PACKAGE, top=TOP_LAYER,
                     forbidden=CONFIG_LAYER + PLOTTING) -> dict[str, set[str]]:
    """{module below the top layer: the forbidden modules it imports, anywhere in it}."""
    out: dict[str, set[str]] = {}
    tops = tuple(f"{package}.{t}" for t in top)
    for module, path in module_files(root, package).items():
        if any(module == t or module.startswith(t + ".") for t in tops):
            continue
        names = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.update([node.module] + [f"{node.module}.{a.name}" for a in node.names])
        bad = {f for f in forbidden for n in names if n == f or n.startswith(f + ".")}
        if bad:
            out[module] = bad
    return out


def strongly_connected(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (each a cycle), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    nodes = sorted(set(edges) | {b for bs in edges.values() for b in bs})
    for start in nodes:  # iterative Tarjan: no recursion limit on deep graphs
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return sorted(out)


# ----------------------------------------------------------------------------- the checks

SHAPE = CodeShape(ROOT)


def test_no_import_cycle_between_files():
    assert SHAPE.file_cycles() == [], "module-level imports form a cycle between these files"


def test_no_import_cycle_between_packages():
    assert SHAPE.package_cycles() == [], "these packages import each other (file or package)"


def test_packages_stand_in_their_layers():
    assert SHAPE.layer_problems() == [], "place the package in LAYERS or move the import"


def test_in_function_imports_are_the_allowed_ones():
    found = {k for k, targets in SHAPE.in_function.items()
             if any(t == PACKAGE or t.startswith(PACKAGE + ".") for t in targets)}
    new = sorted(found - set(IN_FUNCTION_IMPORTS))
    gone = sorted(set(IN_FUNCTION_IMPORTS) - found)
    assert not new, (f"imports of {PACKAGE} inside functions {new}: move them to the module "
                     "top (break a cycle by moving code, not by hiding the import)")
    assert not gone, f"no longer import inside a function: remove {gone} from IN_FUNCTION_IMPORTS"
    assert all(IN_FUNCTION_IMPORTS.values()), "every allowed in-function import needs a reason"


def test_no_long_functions_in_stage_code():
    found = SHAPE.long_functions()
    new = {k: n for k, n in found.items() if k not in LONG_FUNCTIONS}
    gone = sorted(set(LONG_FUNCTIONS) - set(found))
    assert not new, f"functions over {MAX_LINES} lines (split them into named helpers): {new}"
    assert not gone, f"now at most {MAX_LINES} lines: remove {gone} from LONG_FUNCTIONS"


# ----------------------------------------------------------------------------- the checker


def test_nothing_below_the_top_layer_imports_the_config_layer_or_plotting():
    assert layer_violations(ROOT) == {}


def test_layer_check_finds_a_violation(tmp_path):
    root = _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/configuration.py": "import ml_collections\n",
        "pkg/low.py": "def f():\n    import matplotlib.pyplot as plt\n",
        "pkg/mid.py": "from pkg.configuration import x\n",
        "pkg/pipeline/__init__.py": "import matplotlib\nfrom pkg import configuration\n",
    })
    found = layer_violations(root, "pkg", top=("configuration", "pipeline"),
                             forbidden=("ml_collections", "pkg.configuration", "matplotlib"))
    assert found == {"pkg.low": {"matplotlib"}, "pkg.mid": {"pkg.configuration"}}


def _write(root: pathlib.Path, files: Mapping[str, str]) -> pathlib.Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_checker_finds_cycles_in_function_imports_and_long_functions(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    root = _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg import b\n",
        "pkg/b.py": "import pkg.a\n",  # a <-> b
        "pkg/c.py": "from pkg.sub import d\n",
        "pkg/sub/__init__.py": "from .d import f\n",  # its own module: no package edge
        "pkg/sub/d.py": ("try:\n    from pkg import c\nexcept ImportError:\n    pass\n\n"
                         "def f():\n    from pkg import a\n    import os\n"),
        "pkg/rpr/__init__.py": "",
        "pkg/rpr/long.py": f"def long():\n{body}\n\n\ndef short():\n    pass\n",
    })
    shape = CodeShape(root, "pkg")
    assert shape.file_cycles() == [["pkg.a", "pkg.b"], ["pkg.c", "pkg.sub.d"]]
    # top-level modules are nodes of their own; pkg.sub's __init__ importing pkg.sub.d is not
    assert shape.package_cycles() == [["pkg.a", "pkg.b"], ["pkg.c", "pkg.sub"]]
    assert dict(shape.in_function) == {("pkg.sub.d", "f"): {"pkg.a"}}
    assert shape.long_functions(("rpr",)) == {("pkg.rpr.long", "long"): MAX_LINES + 1}
    assert shape.long_functions(("agent",)) == {}


def test_layer_check_finds_misplaced_packages(tmp_path):
    root = _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/base.py": "from pkg.high import h\n",  # down to up
        "pkg/low/__init__.py": "", "pkg/low/a.py": "from pkg import base\n",
        "pkg/high/__init__.py": "", "pkg/high/h.py": "from pkg.low import a\n",
        "pkg/loose/__init__.py": "",
    })
    shape = CodeShape(root, "pkg")
    assert shape.layer_problems((("base",), ("low", "gone"), ("high", "low"))) == [
        "low is in two layers", "loose is in no layer", "gone does not exist",
        "pkg.base (layer 0) imports pkg.high (layer 2)",
        "pkg.high (layer 2) imports pkg.low (layer 2)"]
    assert shape.layer_problems((("base",), ("low",), ("high",), ("loose",))) == [
        "pkg.base (layer 0) imports pkg.high (layer 2)"]


def test_checker_finds_nothing_in_a_clean_package(tmp_path):
    root = _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/low.py": "import os\n",
        "pkg/high.py": "from pkg import low\nfrom pkg.sub import mid\n",
        "pkg/sub/__init__.py": "from pkg.sub.mid import g\n",
        "pkg/sub/mid.py": "from .. import low\n\ndef g():\n    import json\n",
    })
    shape = CodeShape(root, "pkg")
    assert shape.file_cycles() == shape.package_cycles() == []
    assert shape.edges["pkg.sub.mid"] == {"pkg.low"}
    assert not shape.in_function
