"""The layers and the one direction of their dependencies: entrypoints -> actors -> services -> pcl.

Read from the source (every `import` and `from ... import` in every module, at top level, under TYPE_CHECKING or
inside a function), so that a late import cannot hide an edge. Importing `a.b.c` runs `a/__init__.py` and
`a/b/__init__.py` first, so an import counts as an edge to each package on its way too (except the importer's own
packages, which are already running when it runs). Fails on any import cycle between modules counted that way,
on two packages of a layer that import each other (`pcl.loop` and `pcl.strategies`, say, whichever modules it
goes through), on a core module outside `pcl/loop/` that imports the loop (the loop is the core's top: what
strategies, models and engines share sits below it), on any import that points up the layers, on any `pcl`
module that imports ray, redis, services or actors, on any `services` module that imports ray (Ray is the actor
layer's), and on a `bench/` script that takes from `entrypoints/` anything but the training drivers themselves
(`entrypoints.train.run_training`, and `entrypoints.local.run_local` for one process): model, tokenizer and data
loading and Ray start-up are in the library, where both use them.
"""

from __future__ import annotations

import ast
import functools
from collections import deque
from pathlib import Path
from typing import Iterable

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("pcl", "services", "actors", "entrypoints")  # bottom to top: a layer imports only those below it
INFRASTRUCTURE = ("ray", "redis")  # the core runs without them
CORE_TOP = "pcl.loop"  # the training loop: it uses the rest of the core, nothing else in the core uses it


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, root: Path = ROOT) -> dict[str, int]:
    """Every module name `path` imports (absolute or relative), with the line of its first import."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module_name(path, root).rsplit(".", 1)[0] if path.name != "__init__.py" else module_name(path, root)
    names: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            found = [base] + [f"{base}.{alias.name}" for alias in node.names]  # `from pkg import module`
        else:
            continue
        for name in found:
            names[name] = min(names.get(name, node.lineno), node.lineno)
    return names


def packages_of(module: str) -> list[str]:
    """The packages that importing `module` runs before it, outermost first: a.b.c -> [a, a.b]."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


@functools.cache  # read once for the tests below (the tree does not change while they run)
def graph(root: Path = ROOT, layers: tuple[str, ...] = LAYERS) -> dict[str, dict[str, str]]:
    """Edges between the project's own modules (a package is its `__init__`): module -> {what importing it runs:
    where the import is, `path:line`}. `import a.b.c` runs a, a.b and a.b.c, less the importer's own packages."""
    modules = {module_name(p, root): p for layer in layers for p in (root / layer).rglob("*.py")}
    edges: dict[str, dict[str, str]] = {}
    for name, path in modules.items():
        running = {name, *packages_of(name)}
        edges[name] = {}
        for target, line in sorted(imports_of(path, root).items()):
            for runs in [*packages_of(target), target]:
                if runs in modules and runs not in running:
                    edges[name].setdefault(runs, f"{path.relative_to(root)}:{line} imports {target}")
    return edges


def package_of(module: str) -> str:
    """The part of its layer a module belongs to: a subpackage or a top-level module (pcl.loop.step -> pcl.loop)."""
    return ".".join(module.split(".")[:2])


def package_graph(edges: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """The module graph seen between the parts of the layers (`package_of`), each edge with one import behind it."""
    out: dict[str, dict[str, str]] = {}
    for a, targets in sorted(edges.items()):
        for b, where in sorted(targets.items()):
            pa, pb = package_of(a), package_of(b)
            if pa != pb and "." in pa and "." in pb:  # a layer's own __init__ belongs to no part of it
                out.setdefault(pa, {}).setdefault(pb, where)
    return out


def layer_of(module: str) -> int:
    return LAYERS.index(module.split(".")[0])


def cycles(edges: dict[str, Iterable[str]]) -> list[list[str]]:
    """One cycle [a, b, ..., a] for each strongly connected component of the graph that has one (Tarjan's
    algorithm): every cycle of the graph runs inside one of them. The cycle shown is the shortest through the
    component's first node by name."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def enter(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        work.append((node, iter(sorted(edges.get(node, ())))))

    for root in sorted(edges):
        if root in index:
            continue
        work: list = []
        enter(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    enter(child)
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while not component or member != node:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                    components.append(component)
    return [shortest_cycle(edges, c) for c in components if len(c) > 1 or min(c) in edges.get(min(c), ())]


def shortest_cycle(edges: dict[str, Iterable[str]], component: set[str]) -> list[str]:
    """The shortest path from the component's first node back to itself (breadth first)."""
    start = min(component)
    parent: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in sorted(edges.get(node, ())):
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return path[::-1] + [start]
            if nxt in component and nxt not in parent:
                parent[nxt] = node
                queue.append(nxt)
    raise AssertionError(f"no cycle through {start}")  # a strongly connected component always has one


def describe(cycle: list[str], edges: dict[str, dict[str, str]]) -> str:
    return " -> ".join(cycle) + "\n" + "\n".join(f"    {a} -> {b}: {edges[a][b]}" for a, b in zip(cycle, cycle[1:]))


def test_the_layers_exist_as_packages():
    for layer in LAYERS:
        assert (ROOT / layer / "__init__.py").is_file(), f"{layer}/ is not a package"


def test_no_module_imports_a_layer_above_its_own():
    upward = sorted(f"{a} -> {b}" for a, targets in graph().items() for b in targets if layer_of(b) > layer_of(a))
    assert not upward, "imports that point up the layers (entrypoints -> actors -> services -> pcl):\n" + \
        "\n".join(upward)


def test_the_core_imports_no_infrastructure():
    bad = []
    for path in (ROOT / "pcl").rglob("*.py"):
        for target in imports_of(path):
            top = target.split(".")[0]
            if top in INFRASTRUCTURE or top in LAYERS[1:]:
                bad.append(f"{module_name(path)} imports {target}")
    assert not bad, "the core (pcl/) must run without Ray, Redis, services or actors:\n" + "\n".join(sorted(bad))


def test_no_service_imports_ray():
    bad = sorted(f"{module_name(path)} imports {target}" for path in (ROOT / "services").rglob("*.py")
                 for target in imports_of(path) if target.split(".")[0] == "ray")
    assert not bad, "services/ runs without Ray (the actors wrap it):\n" + "\n".join(bad)


# the training drivers themselves (on a fleet, in one process), nothing else
BENCH_MAY_TAKE = {("entrypoints.train", "run_training"), ("entrypoints.local", "run_local")}


def entrypoint_imports(path: Path) -> list[tuple[str, str | None]]:
    """(module, name) of every import of `entrypoints` in `path`; name None for a whole-module import."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names if a.name.split(".")[0] == "entrypoints"]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "entrypoints":
            found += [(node.module, a.name) for a in node.names]
    return found


def test_bench_takes_from_entrypoints_only_the_training_driver():
    bad = sorted(f"bench/{path.name}: {module}" + (f".{name}" if name else "")
                 for path in (ROOT / "bench").glob("*.py")
                 for module, name in entrypoint_imports(path) if (module, name) not in BENCH_MAY_TAKE)
    assert not bad, ("bench/ takes from entrypoints/ at most the training drivers, entrypoints.train.run_training and "
                     "entrypoints.local.run_local (loading and Ray start-up are in the library):\n" + "\n".join(bad))


def test_there_is_no_import_cycle():
    edges = graph()
    found = cycles(edges)
    assert not found, ("import cycles (an import of a.b.c runs a and a.b too; every import counts, under "
                       "TYPE_CHECKING or inside a function as well):\n" + "\n".join(describe(c, edges) for c in found))


def test_no_two_packages_import_each_other():
    edges = package_graph(graph())
    found = cycles(edges)
    assert not found, ("packages of a layer that import each other (through whichever modules): move what both "
                       "use below both\n" + "\n".join(describe(c, edges) for c in found))


def test_the_loop_is_the_top_of_the_core():
    bad = sorted({where for a, targets in graph().items()
                 if a.split(".")[0] == "pcl" and package_of(a) != CORE_TOP
                  for b, where in targets.items() if package_of(b) == CORE_TOP})
    assert not bad, (f"the core below the loop imports {CORE_TOP}: what strategies, models and engines share with "
                     f"the loop belongs below it:\n" + "\n".join(bad))


@pytest.mark.parametrize("edges, found", [
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, [["a", "b", "c", "a"]]),
    ({"a": {"a2"}, "a2": set(), "b": {"b"}}, [["b", "b"]]),
    ({"a": {"b", "x"}, "b": {"a"}, "x": {"y"}, "y": {"z"}, "z": {"x", "a"}}, [["a", "b", "a"]]),
    ({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}}, [["a", "b", "a"], ["c", "d", "e", "c"]]),
])
def test_the_cycle_finder_finds_one_cycle_per_tangle(edges, found):
    assert sorted(cycles(edges)) == found


def test_an_import_runs_the_packages_on_its_way(tmp_path):
    """The hidden cycle: no module imports one that imports it back, but importing `top.loop.batch` runs
    `top/loop/__init__.py`, which imports `step`, which imports the module that asked for `batch`."""
    files = {"top/__init__.py": "", "top/loop/__init__.py": "from top.loop import step\n",
             "top/loop/step.py": "from top.strategies import base\n", "top/loop/batch.py": "",
             "top/strategies/__init__.py": "", "top/strategies/base.py": "def f():\n    from top.loop.batch import x\n"}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    edges = graph(tmp_path, ("top",))
    assert edges["top.strategies.base"] == {"top.loop": "top/strategies/base.py:2 imports top.loop.batch",
                                            "top.loop.batch": "top/strategies/base.py:2 imports top.loop.batch"}
    assert "top" not in edges["top.loop.step"]  # its own packages are already running
    assert cycles(edges) == [["top.loop", "top.loop.step", "top.strategies.base", "top.loop"]]
    assert cycles(package_graph(edges)) == [["top.loop", "top.strategies", "top.loop"]]


# The sizes the layout keeps: a core whose top level a newcomer can read, functions that fit on a screen.
MAX_CORE_MODULES = 12  # top-level modules of pcl/ (subpackages group the rest by concept)
MAX_FUNCTION_LINES = 80  # outside bench/ (benchmarks print long reports)


def test_the_core_top_level_stays_small():
    modules = sorted(p.stem for p in (ROOT / "pcl").glob("*.py") if p.name != "__init__.py")
    assert len(modules) <= MAX_CORE_MODULES, f"pcl/ has {len(modules)} top-level modules: {modules}"


def test_no_function_is_longer_than_the_limit():
    long = []
    for layer in LAYERS:
        for path in (ROOT / layer).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_FUNCTION_LINES:
                        long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)
