"""One module touches the process's environment: dfmp2.util.environment names every variable dfmp2
reads or sets (who sets it, what dfmp2 uses it for) and reads and sets them; every other module
asks it. No module reads os.environ (or os.getenv, ...) itself, and the table names no variable
nothing reads."""

import ast

import pytest
from test_architecture import MODULES

ENVIRONMENT_MODULE = "util.environment"
# the os module's ways into the environment, and the modules that carry them (os re-exports posix's/nt's)
OS_ENVIRONMENT = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}
OS_MODULES = {"os", "posix", "nt"}
ACCESSORS = {"get", "is_set", "set_default"}  # util.environment's functions, each given a variable's name first


def environment_touches(name: str, source: str) -> list:
    """Where a module reaches the environment through the os module: os.environ, os.getenv(...), ...
    (under any name the module binds os to), or a `from os import environ` (or `*`)."""
    tree = ast.parse(source)
    bound = set()  # the names this module binds the os module (or posix, nt) to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bound.update(alias.asname or alias.name.split(".")[0] for alias in node.names
                         if alias.name.split(".")[0] in OS_MODULES and (alias.asname is None or alias.name in OS_MODULES))
    touches = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in OS_ENVIRONMENT and isinstance(node.value, ast.Name) \
                and node.value.id in bound:
            touches.append(f"{name}:{node.lineno} {node.value.id}.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module in OS_MODULES and not node.level:
            taken = sorted(alias.name for alias in node.names if alias.name in OS_ENVIRONMENT | {"*"})
            touches += [f"{name}:{node.lineno} from {node.module} import {taken_name}" for taken_name in taken]
    return sorted(touches, key=lambda touch: int(touch.split(":")[1].split()[0]))


def test_one_module_touches_the_environment():
    touches = [t for name, path in MODULES.items() if name != ENVIRONMENT_MODULE
               for t in environment_touches(name, path.read_text())]
    assert not touches, "read or set environment variables through dfmp2.util.environment: " + ", ".join(touches)


def test_the_rule_catches_every_way_into_the_environment():
    assert environment_touches("m", "import os\nx = os.environ.get('RANK')\n") == ["m:2 os.environ"]
    assert environment_touches("m", "from os import environ\n") == ["m:1 from os import environ"]
    assert environment_touches("m", "import os\n\ndef f():\n    return os.getenv('RANK')\n") == ["m:4 os.getenv"]
    assert environment_touches("m", "import os as system\nsystem.putenv('A', '1')\n") == ["m:2 system.putenv"]
    assert environment_touches("m", "import os.path\nos.unsetenv('A')\n") == ["m:2 os.unsetenv"]
    assert environment_touches("m", "from os import getenv as g, path\n") == ["m:1 from os import getenv"]
    assert environment_touches("m", "from os import *\n") == ["m:1 from os import *"]
    assert environment_touches("m", "import posix\nenv = dict(posix.environ)\n") == ["m:2 posix.environ"]
    assert environment_touches("m", "def f():\n    import os\n    os.environ['A'] = '1'\n") == ["m:3 os.environ"]
    clean = ("import os\nfrom os import path\nfrom ..util import environment\n\n"
             "def f(environ=None):\n    return os.path.join(environment.get('RANK', environ=environ), 'x')\n")
    assert environment_touches("m", clean) == []


def string_constants(source: str) -> set:
    return {node.value for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Constant)
            and isinstance(node.value, str)}


def accessed_names(source: str) -> set:
    """The variable names written out in calls of util.environment's functions (environment.get("RANK"))."""
    return {node.args[0].value for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ACCESSORS
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "environment"
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)}


def test_the_table_names_what_is_read_and_nothing_else():
    """Every variable of VARIABLES is named (as the whole of a string) by a module that reads it, and
    every name written out in a call of util.environment is in VARIABLES (which its functions also
    enforce when called: a KeyError)."""
    from dfmp2.util import environment

    sources = {name: path.read_text() for name, path in MODULES.items() if name != ENVIRONMENT_MODULE}
    named = set().union(*(string_constants(source) for source in sources.values()))
    assert sorted(set(environment.VARIABLES) - named) == []
    accessed = set().union(*(accessed_names(source) for source in sources.values()))
    assert accessed and sorted(accessed - set(environment.VARIABLES)) == []
    assert all(meaning.strip() and "\n" not in meaning for meaning in environment.VARIABLES.values())


def test_the_environment_module_reads_and_sets_named_variables_only():
    from dfmp2.util import environment

    given = {"RANK": "1"}
    assert environment.get("RANK", environ=given) == "1" and environment.get("LOCAL_RANK", "0", given) == "0"
    assert environment.is_set("RANK", given) and not environment.is_set("WORLD_SIZE", given)
    assert environment.set_default("WORLD_SIZE", "2", given) and given["WORLD_SIZE"] == "2"
    assert not environment.set_default("RANK", "5", given) and given["RANK"] == "1"
    with pytest.raises(KeyError, match="PAGER"):
        environment.get("PAGER", environ=given)
