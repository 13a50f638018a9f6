"""The layers and the one direction of their dependencies: entrypoints -> actors -> services -> pcl.

Read from the source (every `import` and `from ... import` in every module, at top level or inside a function),
so that a late import cannot hide an edge. Fails on any import cycle between modules, on any import that points
up the layers, on any `pcl` module that imports ray, redis, services or actors, on any `services` module that
imports ray (Ray is the actor layer's), and on a `bench/` script that takes from `entrypoints/` anything but the
training driver itself (`entrypoints.train.run_training`): model, tokenizer and data loading and Ray start-up
are in the library, where both use them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("pcl", "services", "actors", "entrypoints")  # bottom to top: a layer imports only those below it
INFRASTRUCTURE = ("ray", "redis")  # the core runs without them


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every module name `path` imports (absolute or relative), with where the import sits."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" else module_name(path)
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return names


def graph() -> dict[str, set[str]]:
    """Edges between the project's own modules."""
    modules = {module_name(p): p for layer in LAYERS for p in (ROOT / layer).rglob("*.py")}
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges[name] = {target for target in imports_of(path) if target in modules and target != name}
    return edges


def layer_of(module: str) -> int:
    return LAYERS.index(module.split(".")[0])


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


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


BENCH_MAY_TAKE = {("entrypoints.train", "run_training")}  # the training driver itself, nothing else


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
    assert not bad, ("bench/ takes from entrypoints/ at most entrypoints.train.run_training (loading and Ray "
                     "start-up are in the library):\n" + "\n".join(bad))


def test_there_is_no_import_cycle():
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


@pytest.mark.parametrize("edges, cyclic", [
    ({"a": {"b"}, "b": {"c"}, "c": set()}, False),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, True),
    ({"a": {"a2"}, "a2": set(), "b": {"b"}}, True),
])
def test_the_cycle_finder_finds_cycles(edges, cyclic):
    assert (find_cycle(edges) is not None) == cyclic


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
