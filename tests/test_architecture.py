"""The architecture stays as docs/architecture.md draws it: layers as packages that import
downwards only, PySCF called from the chemistry layer and the PySCF drop-ins alone, no import
cycle between modules, and modules and functions short enough to read."""

import ast
import fnmatch
import pathlib
import re

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
# the NKI emulator: a package of its own beside dfmp2 (tests/test_architecture_emulator.py: it imports nothing of
# dfmp2); no layer of dfmp2, but its modules are as short and its docstrings name what exists as dfmp2's
EMULATOR = PACKAGE.parent / "nki_emulator"
EMULATOR_MODULES = {"nki_emulator" + ("" if path.stem == "__init__" else "." + path.stem): path
                    for path in sorted(EMULATOR.glob("*.py"))}


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
    kernel = PACKAGE / "kernels" / "torch" / "backend.py"
    assert climbing_imports("kernels.torch.backend", imported_modules(
        kernel, "from ...run.memory import plan_for\nfrom .. import protocol\n")) == ["run.memory"]
    assert climbing_imports("util.files", imported_modules(
        PACKAGE / "util" / "files.py", "def f():\n    from ..kernels import get_backend\n")) == ["kernels"]
    assert climbing_imports("mp2.gradient", imported_modules(
        PACKAGE / "mp2" / "gradient.py", "from ..chem import cphf\nfrom .response import relaxed_density\n")) == []
    # the face (`import dfmp2`, `from .. import __version__` one level below it) is above every layer
    assert climbing_imports("run.checkpoint.directory", imported_modules(
        PACKAGE / "run" / "checkpoint" / "directory.py", "from ... import __version__\n")) == [FACE_MODULE]
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
    assert import_cycle({"kernels": {"kernels.nki.backend"}, "kernels.nki.backend": {"kernels"}}) is not None
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
    modules = {**MODULES, **EMULATOR_MODULES}
    findings = [f for name, path in modules.items() for f in length_findings(name, path.read_text())]
    assert not findings, findings


def test_the_rule_catches_a_long_function_and_a_needless_waiver():
    long = "def f():\n" + "    x = 1\n" * LONGEST
    short_waived = 'def g():\n    """Long (why)."""\n    return 1\n'
    assert length_findings("m", long) == [f"m:1 f ({LONGEST + 1} lines > {LONGEST}, no waiver)"]
    assert length_findings("m", short_waived) == ["m:1 g (3 lines <= 60, waived)"]
    assert length_findings("m", 'def h():\n    """Long (why)."""\n' + "    x = 1\n" * LONGEST) == []


CLOCKS = {"perf_counter", "perf_counter_ns", "time", "time_ns", "process_time", "process_time_ns", "monotonic",
          "monotonic_ns", "thread_time", "thread_time_ns", "clock_gettime", "clock_gettime_ns"}


OTHER_CLOCKS = {"process_clock", "perf_counter"}  # PySCF's logger's clocks (pyscf.lib.logger), any module's


def clock_reads(name: str, source: str) -> list:
    """Where a module reads a clock itself: one of the `time` module's, or another module's
    (PySCF's `logger.process_clock`, `logger.perf_counter`, which its `log.timer` needs)."""
    readers = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "time" \
                and node.attr in CLOCKS:
            readers.append(f"{name}:{node.lineno} time.{node.attr}")
        elif isinstance(node, ast.Attribute) and node.attr in OTHER_CLOCKS:
            readers.append(f"{name}:{node.lineno} {ast.unparse(node)}")
        elif isinstance(node, ast.ImportFrom) and node.module == "time" and \
                {alias.name for alias in node.names} & CLOCKS:
            readers.append(f"{name}:{node.lineno} from time import ...")
    return readers


def test_one_clock():
    """Every timing dfmp2 records comes from its one clock (`dfmp2.util.clock`, which the run's Timer
    in `dfmp2.run.context` reads): no other module reads a clock itself, PySCF's logger's included
    (the drop-ins print PySCF's timer line from dfmp2's clock)."""
    readers = [r for name, path in MODULES.items() if name != "util.clock" for r in clock_reads(name, path.read_text())]
    assert not readers, readers


def test_the_rule_catches_every_clock():
    for clock in sorted(CLOCKS):
        assert clock_reads("m", f"import time\nt = time.{clock}()\n") == [f"m:2 time.{clock}"]
    assert clock_reads("m", "from time import monotonic\n") == ["m:1 from time import ..."]
    assert clock_reads("m", "import time\ntime.sleep(1)\n") == []
    assert clock_reads("m", "t = (logger.process_clock(), logger.perf_counter())\n") == [
        "m:1 logger.process_clock", "m:1 logger.perf_counter"]


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


# ----------------------------------------------------------------------------- names the docs give

# heads that name no dfmp2 module: other packages, and objects (`self.`, `mf.`; `backend.record`: the backend a
# step is handed, not the modules kernels.torch.backend and kernels.nki.backend)
EXTERNAL = {"pyscf", "torch", "np", "numpy", "scipy", "nki", "nl", "nisa", "neuronxcc", "click", "h5py", "ase",
            "qcengine", "geometric", "os", "sys", "time", "self", "lib", "mf", "mol", "backend"}
REFERENCE = re.compile(r"`((?:[a-z_][a-z0-9_]*\.)*[a-z_][a-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)")
FILE_SUFFIXES = {"py", "md", "json", "npz", "h5", "xyz", "molden"}  # `report.py` names a file
PACKAGES = {".".join(path.relative_to(PACKAGE).parts) for path in PACKAGE.rglob("*") if path.is_dir()
            and path.name != "__pycache__"}


def top_level_names(source: str, package: bool = False) -> set:
    """What `module.name` can name: a module's functions, classes and assignments (also under a
    top-level if or try); a package's imports too (what its __init__ re-exports). A module that only
    imports a name is not where it lives: `orbitals.frozen_per_spin` named run.settings' function."""
    names = set()
    for statement in ast.parse(source).body:
        for node in [statement] + (list(ast.walk(statement)) if isinstance(statement, (ast.If, ast.Try)) else []):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)) and package:
                names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                    names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def stale_references(text: str, where: str, names: dict) -> list:
    """`module.name` references in `text` (backquoted, as docstrings and docs write them) that name
    nothing: the module (its dotted name, or a dotted tail of it: `pipeline`, `nki.ledger`) lacks
    the name, or no module is called so while the name is a dfmp2 class (a module renamed or
    moved). names: module -> its top-level names; packages count as modules."""
    classes = {n for module_names in names.values() for n in module_names if n[:1].isupper()}
    stale = []
    for match in REFERENCE.finditer(text):
        head, name = match.group(1), match.group(2)
        head = head[len("dfmp2."):] if head.startswith("dfmp2.") else head
        if head.split(".")[0] in EXTERNAL or name in FILE_SUFFIXES:
            continue
        modules = [m for m in names if m == head or m.endswith("." + head)]
        if modules:
            if not any(name in names[m] or f"{m}.{name}" in names for m in modules):
                stale.append(f"{where}: `{head}.{name}` ({' / '.join(modules)} has no {name})")
        elif name in classes:
            stale.append(f"{where}: `{head}.{name}` (there is no module {head})")
    return stale


def module_names() -> dict:
    names = {name: top_level_names(path.read_text(), path.name == "__init__.py" or name in FACE)
             for name, path in MODULES.items()}
    names.update({name: top_level_names(path.read_text(), path.name == "__init__.py")
                  for name, path in EMULATOR_MODULES.items()})
    for package in PACKAGES:
        names.setdefault(package, set())
    return names


def test_docstrings_and_the_architecture_page_name_what_exists():
    names = module_names()
    pages = [PACKAGE.parent / "docs" / "architecture.md", PACKAGE.parent / "docs" / "method.md"]
    stale = [s for name, path in MODULES.items() for s in stale_references(path.read_text(), f"dfmp2.{name}", names)]
    stale += [s for name, path in EMULATOR_MODULES.items() for s in stale_references(path.read_text(), name, names)]
    stale += [s for page in pages for s in stale_references(page.read_text(), page.name, names)]
    assert not stale, stale


def test_the_rule_catches_a_stale_name():
    names = {"mp2.b.ranks": {"RankDensities"}, "mp2.b.provider": {"ovL_of_orbitals"}, "mp2.pipeline": set(),
             "mp2": set()}
    assert stale_references("see `pipeline.ovL_of_orbitals`", "m", names) == [
        "m: `pipeline.ovL_of_orbitals` (mp2.pipeline has no ovL_of_orbitals)"]
    assert stale_references("`distributed.RankDensities`", "m", names) == [
        "m: `distributed.RankDensities` (there is no module distributed)"]
    # a module that imports a name is not where it lives (run.settings' frozen_per_spin, imported by mp2.orbitals)
    assert top_level_names("from ..run.settings import frozen_per_spin\n") == set()
    assert top_level_names("from .settings import Settings\n", package=True) == {"Settings"}
    assert stale_references("`provider.ovL_of_orbitals`, `ranks.RankDensities`, `torch.distributed.Foo`, "
                            "`mp2.b.provider`, `pipeline.py`", "m", names) == []


# ----------------------------------------------------------------------------- the steps and the objects they are handed

STEPS = "mp2.steps"
# what the steps may not do (docs/architecture.md, Rules): ask what they were handed has (a block's format, dense or
# screened, is the one thing a step tells apart), manage memory, run host BLAS of their own, or know of devices,
# storage, ranks or checkpoints
STEP_CALLS = {"hasattr", "getattr", "type", "callable", "release_freed_memory", "released_after_each",
              "block_done", "empty_cache", "collect", "malloc_trim", "dot", "matmul", "einsum", "tensordot",
              "solve_triangular", "cho_solve", "solve", "inv"}
STEP_WORDS = ("rank", "team", "device", "checkpoint", "store", "disk", "scratch", "h5py")
STEP_IMPORTS = ("scipy", "torch", "h5py", "dfmp2.run", "dfmp2.chem")


def step_findings(source: str) -> list:
    """What in a steps module breaks the steps' rules: a call of STEP_CALLS, a matrix product written with @, a
    name or attribute that speaks of devices, storage, ranks or checkpoints, an import of STEP_IMPORTS."""
    findings = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if called in STEP_CALLS:
                findings.append(f"{node.lineno}: calls {called}")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            findings.append(f"{node.lineno}: a host product (@)")
        elif isinstance(node, (ast.Name, ast.Attribute, ast.arg)):
            word = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else node.arg
            if any(w in word.lower() for w in STEP_WORDS):
                findings.append(f"{node.lineno}: names {word}")
        elif isinstance(node, ast.Import):
            findings += [f"{node.lineno}: imports {a.name}" for a in node.names if a.name.startswith(STEP_IMPORTS)]
        elif isinstance(node, ast.ImportFrom):  # the steps module sits one level below the package
            module = "dfmp2." + (node.module or "") if node.level == 2 else node.module or ""
            findings += [f"{node.lineno}: imports {module}"] if module.startswith(STEP_IMPORTS) else []
    return findings


def test_the_steps_take_arrays_blocks_and_a_backend_only():
    """docs/architecture.md: the steps never branch on device, storage, rank or checkpoint, manage no memory and
    run no host BLAS of their own (host arithmetic goes through the backend or linalg)."""
    findings = step_findings(MODULES[STEPS].read_text())
    assert not findings, findings


def test_the_rule_catches_a_step_that_asks_what_it_holds():
    """The check itself: mp2_densities as it was before issue 64 (a hasattr on its schedule, the schedule's
    block_done, a pass-through for rounds without a block over ranks) fails it."""
    old = ("def mp2_densities(backend, schedule):\n"
           "    for i0, i1 in (schedule.fit_blocks(0) if hasattr(schedule, 'fit_blocks') else schedule.held(0)):\n"
           "        schedule.block_done()\n")
    assert step_findings(old) == ["2: calls hasattr", "3: calls block_done"]
    assert step_findings("from ..run.ranks import Team\nx = a @ b\nteam.rank\n") == [
        "1: imports dfmp2.run.ranks", "2: a host product (@)", "3: names rank", "3: names team"]
    assert step_findings("def f(backend, blocks):\n    return backend.gemm(blocks[0], blocks[1])\n") == []


# the layers whose functions never change an object they were handed (the steps, their composition, the policies
# and the layers below them): (module, function) -> why it may, where it must
HANDED_LAYERS = ("util", "linalg", "rng", "run", "mp2")
HANDED_EXCEPTIONS = {("mp2.response", "_pyscf_budget"): "a context manager: PySCF's max_memory for the solve, "
                                                         "restored on the way out"}


def _rooted_at(node, names: set) -> bool:
    """node is a name of `names`, or an attribute of one (a.b.c), or a subscript of one."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return isinstance(node, ast.Name) and node.id in names


# what changes the object it is called on: the containers' mutators (a list, dict or set handed in)
MUTATORS = {"append", "extend", "insert", "remove", "pop", "popitem", "clear", "update", "setdefault", "sort",
            "reverse", "add", "discard", "difference_update", "intersection_update", "symmetric_difference_update"}
# a backend is the device's state, which the steps drive: its protocol's calls (`prepare(plan)`, the
# counters, residency) change it by design; what a step may not change is the caller's own objects
DRIVEN = {"backend"}


def _mutating_call(node, handed: set) -> bool:
    """node calls a mutator (MUTATORS) of a handed object or of a part of one."""
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS \
        and _rooted_at(node.func.value, handed)


def handed_changes(name: str, source: str) -> list:
    """Where a function changes an object it was handed: sets an attribute of it or calls one of its
    mutators (`MUTATORS`). Handed: a parameter (self, cls and the backend aside: `DRIVEN`), or a local
    name bound to a part of one (`timer = context.timer`); a name rebound to something new is not."""
    changes = []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) or \
                (name, function.name) in HANDED_EXCEPTIONS:
            continue
        arguments = function.args.posonlyargs + function.args.args + function.args.kwonlyargs
        handed = {a.arg for a in arguments} - {"self", "cls"} - DRIVEN
        for node in sorted((n for n in ast.walk(function) if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign))
                            or _mutating_call(n, handed)), key=lambda n: (n.lineno, n.col_offset)):
            if isinstance(node, ast.Call):
                if _mutating_call(node, handed):  # (handed as it stands at this line)
                    changes.append(f"{name}:{node.lineno} {function.name} calls {ast.unparse(node.func)}")
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in (t for top in targets for t in ast.walk(top)):
                if isinstance(target, ast.Attribute) and isinstance(target.ctx, ast.Store) and \
                        _rooted_at(target.value, handed):
                    changes.append(f"{name}:{node.lineno} {function.name} sets {ast.unparse(target)}")
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                bound = node.targets[0].id  # an alias of a handed object, or a name rebound to something new
                handed = handed | {bound} if _rooted_at(node.value, handed) and not isinstance(node.value, ast.Name) \
                    or isinstance(node.value, ast.Name) and node.value.id in handed else handed - {bound}
    return changes


def test_no_step_changes_an_object_it_was_handed():
    """docs/architecture.md: what a step is handed (the caller's timer, settings, context, integrals) comes back
    as it was; a step that needs another makes its own (`Timer.synchronized_with`)."""
    changes = [c for name, path in MODULES.items() if name.startswith(HANDED_LAYERS)
               for c in handed_changes(name, path.read_text())]
    assert not changes, changes


def test_the_rule_catches_a_step_that_changes_what_it_was_handed():
    """The check itself: the pipeline as it was before issue 64 set the caller's timer.synchronize."""
    old = "def dfmp2_energy(backend, context):\n    timer = context.timer\n    timer.synchronize = backend.synchronize\n"
    assert handed_changes("mp2.pipeline", old) == ["mp2.pipeline:3 dfmp2_energy sets timer.synchronize"]
    assert handed_changes("m", "def f(settings):\n    settings.frozen[0].n = 2\n") == ["m:2 f sets settings.frozen[0].n"]
    new = ("def f(self, context, backend):\n    self.timer = context.timer\n"
           "    context = replace(context, timer=context.timer.synchronized_with(backend.synchronize))\n"
           "    context.timer.synchronize = None\n")
    assert handed_changes("m", new) == []
    assert handed_changes("m", "def f(notes, arrays):\n    notes.append(1)\n    arrays = dict(arrays)\n"
                               "    arrays.pop(2)\n") == ["m:2 f calls notes.append"]
    assert handed_changes("m", "def f(backend, plan):\n    backend.prepare(plan)\n    backend.calls.update(x=1)\n") == []


# ----------------------------------------------------------------------------- the page names every module

ARCHITECTURE_PAGE = PACKAGE.parent / "docs" / "architecture.md"


def unnamed_modules(page: str, paths: list) -> list:
    """The modules (paths under dfmp2/) that the architecture page gives no owner: named by their path, a glob
    (`dfmp2/kernels/nki/*.py`) or a folder below a layer (`dfmp2/kernels/nki/`); a package's __init__ that
    defines nothing (it re-exports its modules) needs none."""
    named = {token.rstrip(".,;:)") for token in re.findall(r"(dfmp2/[\w./*?-]*)", page)}
    named = {n for n in named if not (n.endswith("/") and n.count("/") <= 2)}  # a whole layer is no owner
    return [path for path, source in paths
            if not any(path == n or fnmatch.fnmatch(path, n) or (n.endswith("/") and path.startswith(n)) for n in named)
            and not (path.endswith("/__init__.py") and not any(isinstance(node, (ast.FunctionDef, ast.ClassDef))
                                                                for node in ast.parse(source).body))]


def test_the_architecture_page_gives_every_module_its_owner():
    paths = [(str(path.relative_to(PACKAGE.parent)), path.read_text()) for path in MODULES.values()]
    missing = unnamed_modules(ARCHITECTURE_PAGE.read_text(), paths)
    assert not missing, f"docs/architecture.md does not say what these own: {missing}"


def test_the_rule_catches_an_unnamed_module():
    page = "| `dfmp2/util/files.py` | ... | `dfmp2/kernels/torch/*.py`, `dfmp2/kernels/nki/`, `dfmp2/run/`"
    paths = [("dfmp2/util/files.py", ""), ("dfmp2/kernels/torch/cpu_gemm.py", ""), ("dfmp2/kernels/nki/launch.py", ""),
             ("dfmp2/run/memory.py", ""), ("dfmp2/chem/__init__.py", "from .scf import run_scf\n"),
             ("dfmp2/linalg/__init__.py", "def gemm(a, b):\n    pass\n")]
    assert unnamed_modules(page, paths) == ["dfmp2/run/memory.py", "dfmp2/linalg/__init__.py"]
