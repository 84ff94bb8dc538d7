"""The architecture stays as docs/architecture.md draws it: layers as packages that import
downwards only, PySCF called from the chemistry layer and the PySCF drop-ins alone, no import
cycle between modules, and modules and functions short enough to read."""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "dfmp2"

# the layers, lowest first: a module imports from its own layer or a lower one, never a higher.
# mp2 sits above chem (the gradient and the response use the CPHF and the derivative integrals).
LAYERS = ["util", "kernels", "linalg", "sparse", "rng", "run", "chem", "mp2", "api", "app"]
# the package's face (`import dfmp2`, `python -m dfmp2`, `dfmp2.native`, `dfmp2.ase`): above every layer
FACE = {"__init__", "__main__", "native", "ase"}
# where PySCF may be imported
PYSCF_USERS = ("chem", "api.pyscf_")
MODULE_LINES = 450  # a longer module says why in its docstring ("Long (...)")
LONGEST = 60  # a longer function says why in its docstring ("Long (...)")


def _modules():
    """(path, dotted name under dfmp2) of every module of the package."""
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        yield path, ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


MODULES = dict((name, path) for path, name in _modules())


def imported_modules(path, source=None) -> set:
    """The dfmp2 modules (dotted names under dfmp2) a file imports, at any level of the file,
    relative imports resolved; `from package import name` counts as the module package.name
    where there is one."""
    relative = path.relative_to(PACKAGE)
    package = list(relative.parts[:-1])
    names = set()
    for node in ast.walk(ast.parse(path.read_text() if source is None else source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)]
                target = base + (node.module.split(".") if node.module else [])
            elif node.module and node.module.split(".")[0] == "dfmp2":
                target = node.module.split(".")[1:]
            else:
                continue
            for alias in node.names:
                sub = ".".join(target + [alias.name])
                names.add(sub if sub in MODULES else ".".join(target))
        elif isinstance(node, ast.Import):
            names.update(alias.name[len("dfmp2."):] for alias in node.names if alias.name.startswith("dfmp2."))
    return {name for name in names if name}


def layer_of(module: str):
    """The index of a module's layer in LAYERS; None for the package's face."""
    top = module.split(".")[0]
    if top in FACE:
        return None
    assert top in LAYERS, f"dfmp2.{module} is in no layer: put it in one of {LAYERS}"
    return LAYERS.index(top)


def climbing_imports(module: str, imported: set) -> list:
    """The imports of `module` that reach a higher layer."""
    own = layer_of(module)
    if own is None:
        return []
    return sorted(name for name in imported if layer_of(name) is not None and layer_of(name) > own)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_layers_import_downwards_only(module):
    upward = climbing_imports(module, imported_modules(MODULES[module]))
    assert not upward, f"dfmp2.{module} (layer {module.split('.')[0]}) imports the higher {upward}"


def test_the_rule_catches_a_climbing_import():
    """The check itself: a kernel that imports the memory plan, or a utility that imports a
    kernel, is caught; importing downwards or within a layer is not."""
    kernel = PACKAGE / "kernels" / "torch_backend.py"
    assert climbing_imports("kernels.torch_backend", imported_modules(
        kernel, "from ..run.memory import plan_for\nfrom . import protocol\n")) == ["run.memory"]
    assert climbing_imports("util.files", imported_modules(
        PACKAGE / "util" / "files.py", "def f():\n    from ..kernels import get_backend\n")) == ["kernels"]
    assert climbing_imports("mp2.gradient", imported_modules(
        PACKAGE / "mp2" / "gradient.py", "from ..chem import cphf\nfrom .response import relaxed_density\n")) == []


def test_no_import_cycles_between_modules():
    """Not even through imports inside functions: every module's imports form a DAG (a
    package's __init__ may gather its own modules' names)."""
    graph = {name: {m for m in imported_modules(path) if m != name and not name.startswith(m + ".")}
             for name, path in MODULES.items()}
    state = {}

    def visit(name, trail):
        if state.get(name) == "done":
            return
        assert state.get(name) != "open", "import cycle: " + " -> ".join(trail + [name])
        state[name] = "open"
        for other in sorted(graph.get(name, ())):
            visit(other, trail + [name])
        state[name] = "done"

    for name in sorted(graph):
        visit(name, [])


def test_pyscf_is_called_from_the_chemistry_layer_and_the_drop_ins_only():
    for name, path in MODULES.items():
        uses = [node for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, (ast.Import, ast.ImportFrom))
                and any((alias.name if isinstance(node, ast.Import) else (node.module or "")).split(".")[0] == "pyscf"
                        for alias in node.names)]
        if uses:
            assert name.startswith(PYSCF_USERS), f"dfmp2.{name} imports pyscf"


def test_modules_are_short_or_say_why():
    long = [f"{name} ({len(path.read_text().splitlines())} lines)" for name, path in MODULES.items()
            if len(path.read_text().splitlines()) > MODULE_LINES
            and "Long (" not in (ast.get_docstring(ast.parse(path.read_text())) or "")]
    assert not long, long


def test_functions_are_short_or_say_why():
    long = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > LONGEST and "Long (" not in (ast.get_docstring(node) or ""):
                    long.append(f"{name}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, long


def test_one_clock():
    """Every timing dfmp2 records comes from the run's Timer (`dfmp2.run.context`): no module
    reads the clock itself (PySCF's own logger in the drop-ins keeps PySCF's log.timer habit)."""
    clocks = {"perf_counter", "perf_counter_ns", "time", "time_ns", "process_time"}
    readers = []
    for name, path in MODULES.items():
        if name == "run.context":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "time" \
                    and node.attr in clocks:
                readers.append(f"{name}:{node.lineno} time.{node.attr}")
            elif isinstance(node, ast.ImportFrom) and node.module == "time" and \
                    {alias.name for alias in node.names} & clocks:
                readers.append(f"{name}:{node.lineno} from time import ...")
    assert not readers, readers


def test_a_step_inside_another_is_taken_out_of_it():
    import time

    from dfmp2.run.context import Timer

    timer = Timer()
    with timer.step("pair_energies"):
        with timer.step("whiten", out_of="pair_energies") as lap:
            time.sleep(0.05)
        time.sleep(0.01)
    assert lap.seconds >= 0.05 and timer.timings["whiten"] == lap.seconds
    assert 0.005 < timer.timings["pair_energies"] < 0.05  # the outer step's own 0.01 s, not the inner 0.05 s
