"""The architecture stays as docs/architecture.md draws it: layers import downwards only, PySCF
is called from the front end alone, and the core's functions stay short enough to read."""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "dfmp2"

# module -> the dfmp2 modules it must never import (directly, at any level of the file)
FORBIDDEN = {
    "steps": {"pipeline", "driver", "storage", "distributed", "checkpoint", "cli", "pyscf_plugin", "chem", "bench"},
    "orbitals": {"pipeline", "driver", "storage", "distributed", "checkpoint", "cli", "pyscf_plugin", "chem"},
    "storage": {"pipeline", "driver", "distributed", "checkpoint", "cli", "pyscf_plugin", "chem"},
    "distributed": {"pipeline", "driver", "checkpoint", "cli", "pyscf_plugin", "chem"},
    "checkpoint": {"pipeline", "driver", "distributed", "cli", "pyscf_plugin", "chem"},
    "pipeline": {"driver", "cli", "pyscf_plugin", "chem", "bench"},
    "driver": {"cli", "pyscf_plugin", "bench"},
    "settings": {"kernels", "pipeline", "driver", "distributed", "checkpoint"},
    "kernels": {"pipeline", "driver", "storage", "distributed", "checkpoint", "chem", "cli", "settings"},
    "sparse": {"kernels", "steps", "pipeline", "driver", "storage", "distributed", "checkpoint", "chem", "cli", "scf",
               "settings", "pyscf_plugin"},
}
# the core whose functions stay under LONGEST lines unless their docstring says why ("Long (")
CORE = ["steps.py", "orbitals.py", "pipeline.py", "driver.py", "storage.py", "distributed.py", "checkpoint.py",
        "context.py", "kernels/torch_backend.py", "kernels/nki_backend.py", "kernels/nki_launch.py",
        "kernels/nki_ledger.py", "kernels/protocol.py", "kernels/__init__.py", "kernels/torch_sparse.py",
        "kernels/nki_sparse.py",
        "sparse/screening.py", "sparse/tensor.py"]
LONGEST = 60


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, ".".join(path.relative_to(PACKAGE).with_suffix("").parts)


def _imported(path):
    """The dfmp2 modules a file imports (relative imports resolved to top-level module names)."""
    tree = ast.parse(path.read_text())
    depth = len(path.relative_to(PACKAGE).parts) - 1
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            up = node.level - 1
            if up > depth:
                continue
            base = list(path.relative_to(PACKAGE).parts[:depth - up] if up <= depth else [])
            target = base + (node.module.split(".") if node.module else [])
            if target:
                names.add(target[0])
            else:  # "from . import x"
                names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dfmp2."):
            names.add(node.module.split(".")[1])
    return names


@pytest.mark.parametrize("module", sorted(FORBIDDEN))
def test_layers_import_downwards_only(module):
    paths = [PACKAGE / f"{module}.py"] if (PACKAGE / f"{module}.py").exists() else \
        sorted((PACKAGE / module).rglob("*.py"))
    assert paths, module
    for path in paths:
        upward = _imported(path) & FORBIDDEN[module]
        assert not upward, f"{path.relative_to(PACKAGE)} imports {sorted(upward)}"


def test_pyscf_is_called_from_the_front_end_only():
    for path, name in _modules():
        tree = ast.parse(path.read_text())
        uses = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                and any((alias.name if isinstance(node, ast.Import) else (node.module or "")).split(".")[0] == "pyscf"
                        for alias in node.names)]
        if uses:
            assert name in ("chem", "pyscf_plugin"), f"{name} imports pyscf"


def test_core_functions_are_short_or_say_why():
    long = []
    for relative in CORE:
        path = PACKAGE / relative
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > LONGEST and "Long (" not in (ast.get_docstring(node) or ""):
                    long.append(f"{relative}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, long
