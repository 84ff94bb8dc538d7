"""docs/architecture.md's rules on backends and providers, checked on the source (issue 64):

1. The MP2 steps' kernels go through a `Backend` and the protocol lists everything a caller uses:
   outside dfmp2/kernels, what is read or set on a backend (a name `backend`, or `<x>.backend`) is
   a member of the backend protocols (kernels/protocol.py), what is read or set on integrals
   (`integrals`, `<x>.integrals`) a member of the provider protocols (run/providers.py, mp2/b/protocol.py), and
   neither is asked for a member by name (getattr/hasattr/setattr with a literal).
2. `kernels/__init__.py` is the one dispatch point, where every device decision is made: outside
   dfmp2/kernels nothing compares with a device name ("cpu", "cuda", "trn1", ...) or a collection
   of them, or tests membership in TRAINIUM, compares a backend's name with "torch" or "nki", or
   asks `get_backend` for a device by its name (an fp64 host backend is `kernels.host_fp64_backend()`).
   (Option choices and messages that name devices are not decisions.)
3. A backend's counter (`calls`) is written by the backend alone: a step that runs outside a
   kernel is recorded with `backend.count(step)`.

Each checker takes a module's source, so each is tested on a snippet that breaks it."""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "dfmp2"
# kind -> (the file declaring its protocols, the protocols listing its members); an object of the kind
# is a name `kind` or an attribute `<x>.kind`
HELD = {
    "backend": ("kernels/protocol.py", ("Backend", "FittedBuildsBackend", "ScreenedBuildsBackend")),
    "integrals": (("run/providers.py", "mp2/b/protocol.py"), ("IntegralProvider", "BProvider", "BasisSetIntegrals")),
}
BY_NAME = ("getattr", "hasattr", "setattr")
DEVICE_NAMES = {"cpu", "cuda", "trn1", "trn2", "trn3"}
BACKEND_NAMES = {"torch", "nki"}
DEVICE_GROUPS = {"TRAINIUM"}  # kernels' tuple of the NKI devices
# the modules of the backend classes: they alone write a backend's counter (the NKI backend's is its
# cost ledger's, kernels.nki.ledger.CostLedger.calls, which NkiBackend.calls is)
COUNTER_OWNERS = {"kernels.torch.backend", "kernels.nki.backend", "kernels.nki.ledger"}


def _modules():
    """(dotted name under dfmp2, source) of every module of the package."""
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)
        yield name, path.read_text()


def _outside_kernels(name: str) -> bool:
    return name.split(".")[0] != "kernels"


def protocol_members(source: str, classes) -> set:
    """Names a protocol declares (annotated attributes, assigned attributes, methods), with those of
    its bases declared in the same source, for each class named in `classes`."""
    declared = {node.name: node for node in ast.parse(source).body if isinstance(node, ast.ClassDef)}
    members, todo = set(), list(classes)
    while todo:
        node = declared[todo.pop()]
        todo.extend(base.id for base in node.bases if isinstance(base, ast.Name) and base.id in declared)
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                members.add(item.name)
            elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                members.add(item.target.id)
            elif isinstance(item, ast.Assign):
                members.update(t.id for t in item.targets if isinstance(t, ast.Name))
    return members


def _source(paths) -> str:
    """The text of the file(s) declaring a kind's protocols."""
    return "\n".join((PACKAGE / path).read_text() for path in ((paths,) if isinstance(paths, str) else paths))


def _members():
    return {kind: protocol_members(_source(path), classes) for kind, (path, classes) in HELD.items()}


def _line(found: str) -> int:
    return int(found.split(":")[1])


def _held(node):
    """The kind ("backend", "integrals") of object `node` names, else None: the name itself or an
    attribute of that name (self.backend, builds.integrals)."""
    if isinstance(node, ast.Name) and node.id in HELD:
        return node.id
    if isinstance(node, ast.Attribute) and node.attr in HELD:
        return node.attr
    return None


def protocol_violations(source: str, module: str, members: dict) -> list:
    """'module:line: what' for each member used on a backend or integrals that its protocols do not
    list, and each getattr/hasattr/setattr of one with a literal name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and _held(node.value) and node.attr not in members[_held(node.value)]:
            found.append(f"{module}:{node.lineno}: {ast.unparse(node)} (not in the {_held(node.value)} protocols)")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in BY_NAME and \
                len(node.args) >= 2 and _held(node.args[0]) and isinstance(node.args[1], ast.Constant):
            found.append(f"{module}:{node.lineno}: {ast.unparse(node)} (a member asked for by name)")
    return sorted(found, key=_line)


def _names_devices(node) -> bool:
    """A device name, a tuple/list/set holding one, or kernels' TRAINIUM."""
    if isinstance(node, ast.Constant):
        return node.value in DEVICE_NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_devices(element) for element in node.elts)
    if isinstance(node, (ast.Name, ast.Attribute)):
        return (node.id if isinstance(node, ast.Name) else node.attr) in DEVICE_GROUPS
    return False


def _names_a_backend(node) -> bool:
    """A backend's name ("torch", "nki") or a collection holding one."""
    if isinstance(node, ast.Constant):
        return node.value in BACKEND_NAMES
    return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(_names_a_backend(e) for e in node.elts)


def _is_device_decision(node) -> bool:
    """A comparison with a device name or a group of them, of `<x>.name` with a backend's name, or
    a `get_backend` call given a device's name."""
    if isinstance(node, ast.Compare):
        sides = (node.left, *node.comparators)
        return any(_names_devices(side) for side in sides) or (
            any(isinstance(side, ast.Attribute) and side.attr == "name" for side in sides)
            and any(_names_a_backend(side) for side in sides))
    if isinstance(node, ast.Call):
        called = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
        given = [*node.args[:1], *(k.value for k in node.keywords if k.arg == "device")]
        return called == "get_backend" and any(_names_devices(value) for value in given)
    return False


def device_decisions(source: str, module: str) -> list:
    """'module:line: code' for each device decision (`_is_device_decision`)."""
    return sorted((f"{module}:{node.lineno}: {ast.unparse(node)}" for node in ast.walk(ast.parse(source))
                   if _is_device_decision(node)), key=_line)


def _is_counter(node) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "calls"


def counter_writes(source: str, module: str) -> list:
    """'module:line: statement' for each write into a `.calls` counter: an (augmented) assignment
    to `<x>.calls[...]`, or its update/subtract/clear/pop/setdefault."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        if any(isinstance(t, ast.Subscript) and _is_counter(t.value) for t in targets) or (
                isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and _is_counter(node.func.value)
                and node.func.attr in ("update", "subtract", "clear", "pop", "setdefault")):
            found.append(f"{module}:{node.lineno}: {ast.unparse(node)}")
    return sorted(found, key=_line)


def test_callers_use_only_what_the_backend_and_provider_protocols_list():
    members = _members()
    found = [v for name, source in _modules() if _outside_kernels(name)
             for v in protocol_violations(source, name, members)]
    assert not found, "used outside the protocols (add it to the protocol, or use what it offers):\n" + "\n".join(found)


def test_device_decisions_are_made_in_kernels_alone():
    found = [v for name, source in _modules() if _outside_kernels(name)
             for v in device_decisions(source, name)]
    assert not found, "device decisions outside kernels (ask the backend or kernels/__init__.py):\n" + "\n".join(found)


def test_only_the_backends_write_their_counters():
    found = [v for name, source in _modules() if name not in COUNTER_OWNERS for v in counter_writes(source, name)]
    assert not found, "a backend's counter written from outside it (use backend.count(step)):\n" + "\n".join(found)


def test_the_protocols_declare_what_the_checker_reads():
    members = _members()
    assert {"gemm", "record", "count", "calls", "fitted_store", "modelled", "on_host"} <= members["backend"]
    assert {"naux", "block", "screening", "pair_blocks", "fitted_rows"} <= members["integrals"]
    assert "launcher" not in members["backend"] and "mol" not in protocol_members(
        (PACKAGE / "run/providers.py").read_text(), ["IntegralProvider"])


VIOLATING = '''
def f(backend, integrals, run, other):
    backend.gemm(a, b)                             # members: fine
    integrals.naux, run.integrals.block(0, 1)
    getattr(other, "simulate", False)              # not a backend
    backend.simulate                               # line 6
    run.backend.launcher.launch()
    streams = getattr(backend, "fitted_store_on_disk", False)
    early = hasattr(self.integrals, "held_bytes")
    integrals.mol = None                           # line 10
    if settings.device == "cuda" or device in ("cpu", "cuda"):
        flush = device not in TRAINIUM or kernels.TRAINIUM == x
    backend.calls["host:eigh"] += 1                # line 13
    self.ledger.calls[name] = 3
    nki.calls.update({"host:x": 1})
    label = "cpu" if made else device              # a value, not a decision
    n = backend.calls["gemm"]                      # a read
'''


def test_the_protocol_checker_flags_a_violating_snippet():
    members = {"backend": {"gemm", "calls"}, "integrals": {"naux", "block"}}
    found = protocol_violations(VIOLATING, "snippet", members)
    assert [v.split(": ")[0] for v in found] == [f"snippet:{n}" for n in (6, 7, 8, 9, 10)]
    assert "getattr(backend, 'fitted_store_on_disk', False) (a member asked for by name)" in found[2]


def test_the_device_checker_flags_a_violating_snippet():
    found = device_decisions(VIOLATING, "snippet")
    assert sorted(found) == ["snippet:11: device in ('cpu', 'cuda')", "snippet:11: settings.device == 'cuda'",
                             "snippet:12: device not in TRAINIUM", "snippet:12: kernels.TRAINIUM == x"]


CHOOSING = '''
def g(backend, settings):
    if backend.name != "nki":                      # line 3: a backend's name
        pass
    host = get_backend("cpu", "fp64")              # line 5: a device by name
    other = kernels.get_backend(device="trn2")     # line 6
    fine = get_backend(settings.device), host_fp64_backend()
    label = {"torch": 1}[backend.name]             # a value, not a decision
'''


def test_the_device_checker_flags_backend_names_and_devices_asked_by_name():
    found = device_decisions(CHOOSING, "snippet")
    assert [f.split(": ")[0] for f in found] == ["snippet:3", "snippet:5", "snippet:6"]


def test_the_counter_checker_flags_a_violating_snippet():
    found = counter_writes(VIOLATING, "snippet")
    assert [v.split(": ")[0] for v in found] == ["snippet:13", "snippet:14", "snippet:15"]


@pytest.mark.parametrize("kind", sorted(HELD))
def test_every_protocol_the_checker_reads_exists(kind):
    path, classes = HELD[kind]
    declared = {node.name for node in ast.parse(_source(path)).body if isinstance(node, ast.ClassDef)}
    assert set(classes) <= declared


def test_the_backends_and_kernels_answer_what_callers_ask():
    """What replaced the callers' device names and getattr: the backends' capabilities, count() and
    modelled(), and kernels' answers known before a backend is loaded."""
    from dfmp2 import kernels
    from dfmp2.kernels.nki.backend import NkiBackend
    from dfmp2.kernels.torch.backend import TorchBackend

    cpu, trn = TorchBackend("cpu", "fp64"), NkiBackend("trn2", simulate=True)
    assert (cpu.on_host, cpu.makes_integrals_on_device, cpu.fitted_store_on_disk) == (True, False, True)
    assert (trn.on_host, trn.makes_integrals_on_device, trn.fitted_store_on_disk) == (False, False, False)
    assert (cpu.batches_gemm, trn.batches_gemm) == (True, False)
    host = kernels.host_fp64_backend()
    assert (host.on_host, host.has_fp64, host.precision) == (True, True, "fp64")
    assert cpu.modelled() == {} and set(trn.modelled()) == {"trn1", "trn2", "trn3"}
    assert cpu.peak_memory_bytes() is None and trn.peak_memory_bytes() is None
    for backend in (cpu, trn):
        backend.count("host:step")
        backend.count("host:step")
        assert backend.record().calls["host:step"] == 2
    assert [kernels.runs_nki(d) for d in kernels.DEVICES] == [False, False, True, True, True]
    assert [kernels.runs_torch(d) for d in kernels.DEVICES] == [True, True, False, False, False]
    assert [kernels.collective_backend(d) for d in kernels.DEVICES] == ["gloo", "nccl", "gloo", "gloo", "gloo"]
    assert kernels.is_host(kernels.HOST) and not kernels.is_host("cuda")
