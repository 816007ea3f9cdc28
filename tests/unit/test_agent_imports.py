"""The agent runs inside someone else's process: it may import the standard library only."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from support import PYTHONS, REPO

AGENT = REPO / "src" / "flight_profiler" / "agent"

# Loads every agent module under the private name the bootstrap uses, then reports which
# top-level modules got imported that are not part of the standard library.
PROBE = r"""
import importlib, importlib.util, json, os, sys
pkg = sys.argv[1]
before = set(sys.modules)
spec = importlib.util.spec_from_file_location(
    "_flight_profiler_agent", os.path.join(pkg, "__init__.py"), submodule_search_locations=[pkg])
mod = importlib.util.module_from_spec(spec)
sys.modules["_flight_profiler_agent"] = mod
spec.loader.exec_module(mod)
failed = {}
for root, dirs, files in os.walk(pkg):
    dirs[:] = [d for d in dirs if d != "__pycache__"]
    for f in sorted(files):
        if f.endswith(".py") and f not in ("__init__.py", "bootstrap.py"):
            rel = os.path.relpath(os.path.join(root, f), pkg)[:-3].replace(os.sep, ".")
            try:
                importlib.import_module("_flight_profiler_agent." + rel)
            except Exception as exc:
                failed[rel] = f"{type(exc).__name__}: {exc}"
new = {m.split(".")[0] for m in set(sys.modules) - before}
foreign = sorted(m for m in new if m not in sys.stdlib_module_names
                 and m != "_flight_profiler_agent")
print(json.dumps({"foreign": foreign, "failed": failed,
                  "flight_profiler": "flight_profiler" in sys.modules}))
"""


def _newest_python() -> str:
    # sys.stdlib_module_names exists from 3.10 on
    candidates = [v for v in PYTHONS if tuple(map(int, v.split("."))) >= (3, 10)]
    return PYTHONS[candidates[-1]] if candidates else sys.executable


def test_agent_imports_only_stdlib_in_a_fresh_interpreter() -> None:
    # the venv's python has torch, numpy, click, rich installed: any import of them would show
    proc = subprocess.run([sys.executable, "-I", "-c", PROBE, str(AGENT)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["foreign"] == [], report
    assert report["failed"] == {}, report
    assert report["flight_profiler"] is False  # loaded under the private name only


@pytest.mark.parametrize("python", [_newest_python()])
def test_agent_imports_on_a_bare_interpreter(python: str) -> None:
    proc = subprocess.run([python, "-I", "-c", PROBE, str(AGENT)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["foreign"] == []


def _imports(path: Path) -> list[tuple[int, str, int]]:
    """(level, module, line) of every import statement, wherever it is in the file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(0, alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((node.level, node.module or "", node.lineno))
    return out


def test_agent_source_has_only_stdlib_and_relative_imports() -> None:
    # also catches imports inside functions that the fresh-interpreter probe never runs
    allowed = set(sys.stdlib_module_names) | {"__future__"}
    bad = []
    for path in sorted(AGENT.rglob("*.py")):
        for level, module, line in _imports(path):
            if level == 0 and module.split(".")[0] not in allowed:
                bad.append(f"{path.relative_to(REPO)}:{line}: import {module}")
    assert bad == [], "\n".join(bad)
