"""The floor plan of docs/architecture.md, enforced: no module imports a floor above its own,
nothing inside the package imports the package root, and no import cycle crosses files except
the capture interpreter's (one strongly connected set, justified in the doc).

Every `import` counts, at module level or inside a function: an import deferred into a function
still makes the importing file depend on the imported one.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "kiln"

# Floors, lowest first. A module may import its own floor and the floors below it.
GROUND = {"_util", "errors", "config", "logs", "options", "diagnostics", "dump", "records",
          "paths", "passes", "version"}
FLOORS = ["ground", "capture", "autograd", "lower", "schedule", "codegen", "runtime", "backends",
          "api", "tools", "package"]

# The capture interpreter is one recursive machine: the translator calls handlers, handlers build
# variables, variables call back into the translator to inline a call. docs/architecture.md.
INTERPRETER_PREFIXES = ("kiln.capture.translator", "kiln.capture.handlers_",
                        "kiln.capture.variables.", "kiln.capture.rules",
                        "kiln.capture.output_graph", "kiln.capture.numpy_")


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(path: Path, modules: dict[str, Path]) -> list[tuple[str, int]]:
    """(module imported, line): `from a import b` names a.b when that is a module, else a."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "kiln"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "kiln":
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                out.append((sub if sub in modules else node.module, node.lineno))
    return out


def floor_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] == "__main__":
        return "package"
    if len(parts) == 2 and parts[1] in GROUND:
        return "ground"
    return parts[1]  # a stage package, api or tools


def _edges() -> dict[str, list[tuple[str, int]]]:
    modules = _modules()
    return {name: [(t, line) for t, line in _imports(path, modules) if t != name]
            for name, path in modules.items()}


def test_every_module_has_a_floor():
    unknown = sorted(m for m in _modules() if floor_of(m) not in FLOORS)
    assert not unknown, f"modules outside the floor plan (docs/architecture.md): {unknown}"


def test_no_module_imports_a_floor_above_its_own():
    upward = []
    for module, targets in _edges().items():
        here = FLOORS.index(floor_of(module))
        for target, line in targets:
            if FLOORS.index(floor_of(target)) > here:
                upward.append(f"{module}:{line} imports {target} "
                              f"({floor_of(module)} -> {floor_of(target)})")
    assert not upward, "imports up the floors:\n" + "\n".join(sorted(upward))


def test_nothing_inside_imports_the_package_root():
    offenders = [f"{module}:{line}" for module, targets in _edges().items()
                 if floor_of(module) != "package"
                 for target, line in targets if target == "kiln"]
    assert not offenders, ("imports of the package root from inside (import the defining "
                           "module instead): " + ", ".join(sorted(offenders)))


def _cycles(edges: dict[str, list[tuple[str, int]]]) -> list[list[str]]:
    """Strongly connected sets of more than one module (iterative Tarjan)."""
    graph = {m: sorted({t for t, _ in ts if t in edges}) for m, ts in edges.items()}
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        found.append(sorted(group))
            elif child not in index:
                index[child] = low[child] = counter
                counter += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(graph[child])))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def _is_interpreter(module: str) -> bool:
    return module.startswith(INTERPRETER_PREFIXES)


def test_no_import_cycles_except_the_capture_interpreter():
    bad = [group for group in _cycles(_edges()) if not all(map(_is_interpreter, group))]
    assert not bad, "import cycles across files:\n" + "\n".join(" <-> ".join(g) for g in bad)


def test_the_checker_finds_an_upward_import_and_a_cycle():
    edges = {"kiln.capture.a": [("kiln.runtime.b", 3)], "kiln.runtime.b": [("kiln.capture.a", 1)]}
    assert _cycles(edges) == [["kiln.capture.a", "kiln.runtime.b"]]
    assert FLOORS.index(floor_of("kiln.runtime.b")) > FLOORS.index(floor_of("kiln.capture.a"))
    assert floor_of("kiln.errors") == "ground" and floor_of("kiln") == "package"
