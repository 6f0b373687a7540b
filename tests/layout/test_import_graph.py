"""The package's import graph: one-way chains, and every module importable on its own.

Why: modules that import each other only work when imported in one order, and hide that
with imports inside functions; a reader then cannot tell which layer a module sits in.
The graph is read from the source (ast), every import counted wherever it sits, so an
import moved into a function to dodge a cycle is still a cycle here.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"horovodish": ROOT / "horovodish", "horovodish.launcher": ROOT / "launcher"}


def module_files() -> dict[str, Path]:
    """Every module of the package by dotted name (package __init__ under its package)."""
    modules = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            relative = path.relative_to(folder).with_suffix("")
            parts = [p for p in relative.parts if p != "__init__"]
            if "alias" in parts:  # horovodish/compat/alias: the `horovod` name, not ours
                continue
            name = ".".join([package, *parts])
            if package == "horovodish" and parts[:1] == ["launcher"]:
                continue
            modules[name] = path
    return modules


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that this module imports, anywhere in its body."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            # `from pkg import sub` imports the submodule; `from mod import name` the module.
            targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules
                       else source for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10000)
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def describe(component: list[str], graph: dict[str, set[str]]) -> str:
    members = set(component)
    edges = [f"  {a} -> {b}" for a in component for b in sorted(graph[a] & members)]
    return "\n".join([", ".join(component), *edges])


def test_the_checker_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 50, sorted(graph)  # the walk found the package
    found = cycles(graph)
    assert not found, "import cycles (a -> b: a imports b):\n" + \
        "\n\n".join(describe(c, graph) for c in found)


# Framework adapters are left out (importing TensorFlow alone takes seconds), and so
# are __main__ modules, which run when imported.
CORE_AND_LAUNCHER = [name for name in sorted(module_files())
                     if not name.startswith(("horovodish.torch", "horovodish.tensorflow",
                                             "horovodish.keras"))
                     and not name.endswith(".__main__")]


# Run in a fresh interpreter: third-party modules that every core module needs (and that
# start no thread and no MPI) are imported once, then each core module is imported first,
# alone, in a forked child of that interpreter. The same question as one interpreter per
# module, at a fraction of the cost (numpy's import was most of each one's).
FIRST_IMPORTS = """
import os, sys, traceback
import numpy, ml_dtypes, cloudpickle
failures = 0
for name in sys.argv[1:]:
    child = os.fork()
    if child == 0:
        try:
            __import__(name)
        except BaseException:
            lines = traceback.format_exc().strip().splitlines()
            sys.stdout.write(f"{name}: {lines[-1]}\\n")
            sys.stdout.flush()
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(child, 0)
    if status != 0:
        failures += 1
        if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 1:  # ended unreported
            sys.stdout.write(f"{name}: wait status {status}\\n")
sys.exit(1 if failures else 0)
"""


def test_every_core_module_imports_first_in_a_fresh_interpreter():
    """Each module imported first, alone: an order-dependent import fails here. (Two
    interpreters, half the modules each: they mostly wait on imports from disk.)"""
    from concurrent.futures import ThreadPoolExecutor

    def first_imports(names: list[str]) -> list[str]:
        result = subprocess.run([sys.executable, "-c", FIRST_IMPORTS, *names],
                                capture_output=True, text=True, timeout=300)
        return [line for line in result.stdout.splitlines() if line.strip()] or \
            ([f"{names}: {result.stderr.strip()[-2000:]}"] if result.returncode else [])
    halves = [CORE_AND_LAUNCHER[0::2], CORE_AND_LAUNCHER[1::2]]
    with ThreadPoolExecutor(max_workers=2) as pool:
        failures = [f for found in pool.map(first_imports, halves) for f in found]
    assert not failures, "\n".join(failures)


# The core's stages, from the top down (docs/internals.md, "Stages"): a module may import
# its own stage and the stages below it, never one above. The backends sit between the
# executor that calls them and the execution helpers they are built from (fusion plans,
# buffers, fused groups, arithmetic, CUDA). Any other module directly in
# horovodish/common/ is a leaf (records, errors, settings, the shared-memory barrier,
# entries and handles): below every stage.
_EXECUTION = "horovodish.common.execution"
STAGES = [
    ("api", ("horovodish.common.api", "horovodish.common.elastic",
             "horovodish.common.elastic_store")),
    ("runtime", ("horovodish.common.runtime", "horovodish.common.world")),
    ("negotiation and the executor", ("horovodish.common.negotiation", _EXECUTION)),
    ("backends", (f"{_EXECUTION}.backends",)),
    ("execution helpers", tuple(f"{_EXECUTION}.{name}" for name in (
        "arithmetic", "datatype_copies", "fusion", "buffers", "fused_group", "cuda",
        "cuda_streams", "gpu_fusion"))),
]


def stage_of(module: str) -> int | None:
    """The module's stage (0 is the top); len(STAGES) for a leaf of common; None outside
    the core."""
    found = None
    for level, (_, prefixes) in enumerate(STAGES):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                found = level  # the deepest match: backends is inside execution
    if found is not None:
        return found
    return len(STAGES) if module.startswith("horovodish.common.") else None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    def name(level: int) -> str:
        return STAGES[level][0] if level < len(STAGES) else "leaf"
    found = []
    for module, targets in sorted(graph.items()):
        here = stage_of(module)
        if here is None:
            continue
        for target in sorted(targets):
            there = stage_of(target)
            if there is not None and there < here:
                found.append(f"{module} ({name(here)}) imports {target} ({name(there)})")
    return found


def test_the_core_s_stages_import_downward_only():
    assert upward_imports(import_graph()) == []


def test_an_upward_import_is_caught():
    graph = {"horovodish.common.execution.backends.shm": {"horovodish.common.runtime.thread"},
             "horovodish.common.messages": {"horovodish.common.api.collectives"},
             "horovodish.common.api.collectives": {"horovodish.common.messages"}}
    assert upward_imports(graph) == [
        "horovodish.common.execution.backends.shm (backends) imports "
        "horovodish.common.runtime.thread (runtime)",
        "horovodish.common.messages (leaf) imports horovodish.common.api.collectives (api)"]
