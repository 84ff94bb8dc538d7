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


FACE_MODULE = "__init__"  # `from .. import x` / `from dfmp2 import x` of a layer module: an import of the face


def imported_modules(path, source=None) -> set:
    """The dfmp2 modules (dotted names under dfmp2) a file imports, at any level of the file,
    relative imports resolved; `from package import name` counts as the module package.name
    where there is one, else as the package itself (its __init__; the top package: the face)."""
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
                names.add(sub if sub in MODULES else ".".join(target) or FACE_MODULE)
        elif isinstance(node, ast.Import):
            names.update(alias.name[len("dfmp2."):] for alias in node.names if alias.name.startswith("dfmp2."))
            names.update(FACE_MODULE for alias in node.names if alias.name == "dfmp2")
    return {name for name in names if name}


def layer_of(module: str):
    """The index of a module's layer in LAYERS; None for the package's face."""
    top = module.split(".")[0]
    if top in FACE:
        return None
    assert top in LAYERS, f"dfmp2.{module} is in no layer: put it in one of {LAYERS}"
    return LAYERS.index(top)


def climbing_imports(module: str, imported: set) -> list:
    """The imports of `module` that reach a higher layer; the package's face is above every layer."""
    own = layer_of(module)
    if own is None:
        return []
    return sorted(name for name in imported if layer_of(name) is None or layer_of(name) > own)


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
    # the face (`import dfmp2`, `from .. import __version__` one level below it) is above every layer
    assert climbing_imports("run.checkpoint", imported_modules(
        PACKAGE / "run" / "checkpoint.py", "from .. import __version__\n")) == [FACE_MODULE]
    assert climbing_imports("util.files", imported_modules(
        PACKAGE / "util" / "files.py", "def f():\n    import dfmp2\n")) == [FACE_MODULE]


def import_cycle(graph: dict):
    """The first import cycle of `graph` (module -> the modules it imports), as a list, or None."""
    state = {}

    def visit(name, trail):
        if state.get(name) == "done":
            return None
        if state.get(name) == "open":
            return trail[trail.index(name):] + [name]
        state[name] = "open"
        for other in sorted(graph.get(name, ())):
            found = visit(other, trail + [name])
            if found:
                return found
        state[name] = "done"
        return None

    return next((cycle for cycle in (visit(name, []) for name in sorted(graph)) if cycle), None)


def import_graph() -> dict:
    """Every module's imports, edges to its own parent packages and to the face included."""
    return {name: {m for m in imported_modules(path) if m != name} for name, path in MODULES.items()}


def test_no_import_cycles_between_modules():
    """Not even through imports inside functions, nor through a package's __init__ or the face:
    every module's imports form a DAG."""
    cycle = import_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_rule_catches_an_import_cycle():
    """The check itself: a module importing the face that imports it back, or its parent package whose
    __init__ imports it, is a cycle; a chain that ends is not."""
    assert import_cycle({"__init__": {"api.driver"}, "api.driver": {"run.checkpoint"},
                         "run.checkpoint": {"__init__"}}) == ["__init__", "api.driver", "run.checkpoint", "__init__"]
    assert import_cycle({"kernels": {"kernels.nki_backend"}, "kernels.nki_backend": {"kernels"}}) is not None
    assert import_cycle({"app.cli": {"api.driver"}, "api.driver": {"run.checkpoint"}}) is None
    # the face's own imports are edges of the real graph: an import of the face from below would close a cycle
    assert "api.qcengine_harness" in import_graph()[FACE_MODULE]


def test_pyscf_is_called_from_the_chemistry_layer_and_the_drop_ins_only():
    for name, path in MODULES.items():
        uses = [node for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, (ast.Import, ast.ImportFrom))
                and any((alias.name if isinstance(node, ast.Import) else (node.module or "")).split(".")[0] == "pyscf"
                        for alias in node.names)]
        if uses:
            assert name.startswith(PYSCF_USERS), f"dfmp2.{name} imports pyscf"


def length_findings(name: str, source: str) -> list:
    """A module's and its functions' lengths against the limits: too long without a "Long (...)" waiver
    in the docstring, or waived while within the limit (a waiver says why a length is needed)."""
    findings = []
    tree = ast.parse(source)
    units = [(name, len(source.splitlines()), MODULE_LINES, ast.get_docstring(tree))]
    units += [(f"{name}:{node.lineno} {node.name}", node.end_lineno - node.lineno + 1, LONGEST, ast.get_docstring(node))
              for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for unit, lines, limit, doc in units:
        waived = "Long (" in (doc or "")
        if lines > limit and not waived:
            findings.append(f"{unit} ({lines} lines > {limit}, no waiver)")
        elif waived and lines <= limit:
            findings.append(f"{unit} ({lines} lines <= {limit}, waived)")
    return findings


def test_modules_and_functions_are_short_or_say_why():
    findings = [f for name, path in MODULES.items() for f in length_findings(name, path.read_text())]
    assert not findings, findings


def test_the_rule_catches_a_long_function_and_a_needless_waiver():
    long = "def f():\n" + "    x = 1\n" * LONGEST
    short_waived = 'def g():\n    """Long (why)."""\n    return 1\n'
    assert length_findings("m", long) == [f"m:1 f ({LONGEST + 1} lines > {LONGEST}, no waiver)"]
    assert length_findings("m", short_waived) == ["m:1 g (3 lines <= 60, waived)"]
    assert length_findings("m", 'def h():\n    """Long (why)."""\n' + "    x = 1\n" * LONGEST) == []


CLOCKS = {"perf_counter", "perf_counter_ns", "time", "time_ns", "process_time", "process_time_ns", "monotonic",
          "monotonic_ns", "thread_time", "thread_time_ns", "clock_gettime", "clock_gettime_ns"}


def clock_reads(name: str, source: str) -> list:
    """Where a module reads a clock of the `time` module itself."""
    readers = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "time" \
                and node.attr in CLOCKS:
            readers.append(f"{name}:{node.lineno} time.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module == "time" and \
                {alias.name for alias in node.names} & CLOCKS:
            readers.append(f"{name}:{node.lineno} from time import ...")
    return readers


def test_one_clock():
    """Every timing dfmp2 records comes from the run's Timer (`dfmp2.run.context`): no module
    reads the clock itself (PySCF's own logger in the drop-ins keeps PySCF's log.timer habit)."""
    readers = [r for name, path in MODULES.items() if name != "run.context" for r in clock_reads(name, path.read_text())]
    assert not readers, readers


def test_the_rule_catches_every_clock():
    for clock in sorted(CLOCKS):
        assert clock_reads("m", f"import time\nt = time.{clock}()\n") == [f"m:2 time.{clock}"]
    assert clock_reads("m", "from time import monotonic\n") == ["m:1 from time import ..."]
    assert clock_reads("m", "import time\ntime.sleep(1)\n") == []


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
