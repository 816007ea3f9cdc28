"""The layers of docs/architecture.md, kept by reading every module's imports (AST, no import).

Module-level and function-level imports both count: an import inside a function is still a
dependency, and a cycle that only closes at call time is still a cycle. Imports under
``if TYPE_CHECKING:`` never run: they obey the layer rules but close no cycle. An import may be
marked ``# lazy: <why>`` on its line when it is deliberately deferred (e.g. the console script
imports nothing before main()); marked imports are left out of the cycle search only.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from support import REPO

SRC = REPO / "src"
PKG = "flight_profiler"

# What the CLI side (everything outside agent/) may import of the agent: the wire format, the
# bounds on a request, the expression scanner both sides apply, the mending of torch's broken
# trace exports both sides read. Nothing that touches the
# target's objects (the agent's atomic writer, value renderers, handlers stay its own).
# These modules themselves import only each other.
AGENT_CONTRACT = frozenset(f"{PKG}.agent.{name}" for name in ("protocol", "limits", "expressions",
                                                              "trace_repair"))


@dataclass(frozen=True)
class Import:
    importer: str  # dotted module name
    target: str  # dotted module name (the deepest module the statement names)
    where: str  # "src/flight_profiler/x.py:12", for the failure message
    in_function: bool
    type_only: bool  # under `if TYPE_CHECKING:`
    lazy: bool  # marked `# lazy:` on its line


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, Path] = {
    _module_name(p): p for p in sorted((SRC / PKG).rglob("*.py")) if "__pycache__" not in p.parts
}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    if not is_package:
        base.pop()
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _deepest_module(name: str) -> str | None:
    """``flight_profiler.agent.protocol.ERR_USAGE`` -> ``flight_profiler.agent.protocol``."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports_of(module: str, path: Path) -> list[Import]:
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    is_package = path.name == "__init__.py"
    rel = path.relative_to(REPO).as_posix()
    found: list[Import] = []

    def visit(node: ast.AST, in_function: bool, type_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                if isinstance(child, ast.Import):
                    names = [alias.name for alias in child.names]
                else:
                    base = _resolve(module, is_package, child)
                    # `from pkg import mod` names the module mod; `from mod import name` names mod
                    names = [f"{base}.{alias.name}" for alias in child.names]
                line = lines[child.lineno - 1]
                for name in names:
                    target = _deepest_module(name) if name.startswith(PKG) else None
                    if target is not None and target != module:
                        found.append(Import(module, target, f"{rel}:{child.lineno}", in_function,
                                            type_only, "# lazy:" in line))
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, True, type_only)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    visit(ast.Module(body=[stmt], type_ignores=[]), in_function, True)
                for stmt in child.orelse:
                    visit(ast.Module(body=[stmt], type_ignores=[]), in_function, type_only)
            else:
                visit(child, in_function, type_only)

    visit(ast.parse(source, filename=str(path)), False, False)
    return found


# One entry per statement and module imported (`from m import a, b` imports m once).
IMPORTS: list[Import] = list(dict.fromkeys(
    imp for mod, path in MODULES.items() for imp in _imports_of(mod, path)))


def _within(module: str, package: str) -> bool:
    full = f"{PKG}.{package}" if package else PKG
    return module == full or module.startswith(full + ".")


def _offending(rule: str, bad: list[Import]) -> str:
    return f"{rule}:\n" + "\n".join(f"  {i.where}: {i.importer} imports {i.target}" for i in bad)


def test_the_scan_sees_the_known_layers() -> None:
    # A scan that found nothing would pass every rule below: prove it reads real imports.
    assert {f"{PKG}.cli.main", f"{PKG}.agent.server", f"{PKG}.report.engine"} <= set(MODULES)
    edges = {(i.importer, i.target) for i in IMPORTS}
    assert (f"{PKG}.client", f"{PKG}.agent.protocol") in edges  # absolute, module level
    assert (f"{PKG}.agent.hooks", f"{PKG}.agent.hook_codegen") in edges  # relative import
    assert any(i.in_function for i in IMPORTS) and any(i.type_only for i in IMPORTS)


def test_nothing_outside_cli_imports_cli() -> None:
    bad = [i for i in IMPORTS if _within(i.target, "cli") and not _within(i.importer, "cli")
           and i.importer != f"{PKG}.__main__"]
    assert not bad, _offending("only cli/ (and __main__.py) may import cli/", bad)


def test_report_knows_nothing_of_views_commands_or_targets() -> None:
    banned = ("render", "cli", "diagnose", "attach")
    bad = [i for i in IMPORTS if _within(i.importer, "report")
           and any(_within(i.target, b) for b in banned)]
    assert not bad, _offending("report/ imports none of render/, cli/, diagnose/, attach/", bad)


def test_agent_imports_nothing_of_the_project_outside_itself() -> None:
    bad = [i for i in IMPORTS if _within(i.importer, "agent") and not _within(i.target, "agent")]
    assert not bad, _offending("agent/ runs in the target: it imports only agent/ modules", bad)


def test_the_rest_imports_only_the_agents_contract_modules() -> None:
    bad = [i for i in IMPORTS if not _within(i.importer, "agent") and _within(i.target, "agent")
           and i.target not in AGENT_CONTRACT]
    assert not bad, _offending(
        f"outside agent/, only the agent's contract modules may be imported ({', '.join(sorted(AGENT_CONTRACT))})",
        bad)


def test_contract_modules_import_only_each_other() -> None:
    # Importing protocol.py from the CLI must not pull agent internals along.
    assert set(MODULES) >= AGENT_CONTRACT
    bad = [i for i in IMPORTS if i.importer in AGENT_CONTRACT and i.target not in AGENT_CONTRACT]
    assert not bad, _offending("an agent contract module imports only other contract modules", bad)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
    return components


def test_cycle_search_finds_a_cycle() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(edges) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def _cycle_problems(package: str) -> list[str]:
    runtime = [i for i in IMPORTS if not i.type_only and not i.lazy
               and _within(i.importer, package) and _within(i.target, package)]
    edges: dict[str, set[str]] = {}
    for i in runtime:
        edges.setdefault(i.importer, set()).add(i.target)
    problems = []
    for component in _cycles(edges):
        members = set(component)
        inner = [i for i in runtime if i.importer in members and i.target in members]
        problems.append(_offending(f"cycle among {', '.join(component)}", inner))
    return problems


def test_the_agents_hooks_targets_and_codegen_form_no_cycle() -> None:
    # hook_registry.py is the leaf they all read; a late import must not sneak the cycle back.
    leaf = [i for i in IMPORTS if i.importer == f"{PKG}.agent.hook_registry"]
    assert not leaf, _offending("the hook registry is a leaf: it imports no project module", leaf)
    assert not (problems := _cycle_problems("agent")), "\n".join(problems)


def test_no_import_cycles_among_the_projects_modules() -> None:
    assert not (problems := _cycle_problems("")), "\n".join(problems)
