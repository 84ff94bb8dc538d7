"""The NKI emulator is a package of its own beside dfmp2 (nki_emulator/), ready to be its own distribution:
none of its modules imports dfmp2, at any level of the file (inside functions too), and none reads the
environment; the Neuron settings it follows come through the reader dfmp2 installs (kernels/nki/__init__.py,
from util.environment)."""

import ast

import pytest
from test_architecture import EMULATOR, EMULATOR_MODULES
from test_architecture_environment import environment_touches

FOREIGN = "dfmp2"
DYNAMIC_IMPORTS = {"import_module", "__import__"}  # importlib.import_module("dfmp2..."), __import__("dfmp2")


def _is_foreign(module: str) -> bool:
    return module == FOREIGN or module.startswith(FOREIGN + ".")


def foreign_imports(name: str, source: str, depth: int = 1) -> list:
    """Where a module of the emulator (`depth` packages deep: 1 for nki_emulator's own modules) imports dfmp2:
    `import dfmp2...`, `from dfmp2... import`, a relative import that climbs out of the package, or a dynamic
    import of a dfmp2 name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"{name}:{node.lineno} import {alias.name}" for alias in node.names if _is_foreign(alias.name)]
        elif isinstance(node, ast.ImportFrom):
            if node.level > depth:
                found.append(f"{name}:{node.lineno} from {'.' * node.level}{node.module or ''} (outside the package)")
            elif not node.level and node.module and _is_foreign(node.module):
                found.append(f"{name}:{node.lineno} from {node.module}")
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) and _is_foreign(node.args[0].value):
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if called in DYNAMIC_IMPORTS:
                found.append(f"{name}:{node.lineno} {called}({node.args[0].value!r})")
    return found


def test_the_emulator_is_where_it_is_looked_for():
    assert EMULATOR.is_dir() and {"nki_emulator", "nki_emulator.core", "nki_emulator.isa",
                                  "nki_emulator.language"} <= set(EMULATOR_MODULES)


@pytest.mark.parametrize("module", sorted(EMULATOR_MODULES))
def test_the_emulator_imports_nothing_of_dfmp2(module):
    found = foreign_imports(module, EMULATOR_MODULES[module].read_text())
    assert not found, f"{module} imports dfmp2 (the emulator must stand alone): {found}"


def test_the_rule_catches_every_import_of_dfmp2():
    assert foreign_imports("m", "import dfmp2\n") == ["m:1 import dfmp2"]
    assert foreign_imports("m", "import numpy, dfmp2.util.environment as e\n") == ["m:1 import dfmp2.util.environment"]
    assert foreign_imports("m", "from dfmp2.util import environment\n") == ["m:1 from dfmp2.util"]
    assert foreign_imports("m", "def f():\n    from dfmp2 import kernels\n") == ["m:2 from dfmp2"]
    assert foreign_imports("m", "from ..util import environment\n") == ["m:1 from ..util (outside the package)"]
    assert foreign_imports("m", "import importlib\nx = importlib.import_module('dfmp2.kernels')\n") == [
        "m:2 import_module('dfmp2.kernels')"]
    assert foreign_imports("m", "x = __import__('dfmp2')\n") == ["m:1 __import__('dfmp2')"]
    clean = ("import numpy as np\nfrom . import core\nfrom .core import Tile\nimport dfmp2x\n"
             "def f():\n    from .language import DTYPES\n    return 'dfmp2 kernels'\n")
    assert foreign_imports("m", clean) == []


@pytest.mark.parametrize("module", sorted(EMULATOR_MODULES))
def test_the_emulator_reads_no_environment(module):
    touches = environment_touches(module, EMULATOR_MODULES[module].read_text())
    assert not touches, f"{module} reads the environment (take the setting from the host's reader): {touches}"


def test_the_rule_catches_an_environment_read_in_the_emulator():
    assert environment_touches("m", "import os\nx = os.environ.get('NEURON_LOGICAL_NC_CONFIG')\n") == ["m:2 os.environ"]
    assert environment_touches("m", "import os\n\ndef f():\n    return os.getenv('A')\n") == ["m:4 os.getenv"]


def test_dfmp2_hands_the_emulator_the_settings_it_follows(monkeypatch):
    """dfmp2 names in NEURON_SETTINGS the settings the emulator follows and reads them through util.environment
    (whose VARIABLES names each), each time the emulator asks; the emulator alone knows no value of its host."""
    import nki_emulator
    from dfmp2.kernels import nki
    from dfmp2.util import environment

    assert set(nki.NEURON_SETTINGS) == set(nki_emulator.SETTINGS) <= set(environment.VARIABLES)
    assert nki_emulator.core._settings_reader is nki.neuron_setting
    monkeypatch.setenv("NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE", "true")
    assert nki_emulator.setting("NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE", "") == "true"
    monkeypatch.delenv("NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE")
    assert nki_emulator.setting("NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE", "") == ""
    with pytest.raises(KeyError, match="PAGER"):
        nki_emulator.setting("PAGER")
    monkeypatch.setattr(nki_emulator.core, "_settings_reader", None)  # no host: every setting its default
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    assert nki_emulator.setting("NEURON_LOGICAL_NC_CONFIG") is None
