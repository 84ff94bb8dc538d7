"""docs/architecture.md's vocabulary, checked on the source (issue 74): the three DF tensors each
have one name after their symbol, (mn|P) `mnP`/`MNP`, (ia|P) `iaP`, B `B`/`ovL`, and no identifier
of the package (a module, a function, a class, an argument, a name or attribute assigned) is the
old word "three_center"/"ThreeCenter" for any of them, but the deprecated aliases below.

The checker takes a module's source and name, so it is tested on a snippet that breaks it."""

import ast
import importlib
import pathlib
import re

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "dfmp2"
OLD_WORD = re.compile(r"three_?center", re.IGNORECASE)
# the deprecated aliases (module -> old names), each its module's OLD_NAMES: warned, kept for users
DEPRECATED = {"dfmp2.chem": {"ThreeCenterIntegrals"}, "dfmp2.sparse": {"ScreenedThreeCenter"},
              "dfmp2.api.pyscf_plugin": {"ThreeCenterMO"}}
ALLOWED = set().union(*DEPRECATED.values())


def _defined_names(tree) -> set:
    """The identifiers a module defines: functions, classes, arguments, names and attributes
    assigned or imported under their own name."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.split(".")[-1])
            names.update(node.name.split("."))
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.update(node.module.split("."))
    return names


def old_word_findings(module: str, source: str) -> list:
    """'module: name' for the module's own name and each identifier it defines that says three_center."""
    names = set(module.split(".")) | _defined_names(ast.parse(source))
    return sorted(f"{module}: {name}" for name in names if OLD_WORD.search(name) and name not in ALLOWED)


def test_no_identifier_says_three_center():
    findings = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        findings += old_word_findings(module, path.read_text())
    assert findings == []


def test_the_rule_catches_the_old_word():
    source = ("from .three_center import x\nclass ThreeCenterThing: pass\ndef f(three_center): pass\n"
              "def three_center_mo(): pass\nobj.local_three_center = 1\nThreeCenterMO = 2\nmnP = 3\n")
    assert old_word_findings("dfmp2.mp2.three_center", source) == [
        "dfmp2.mp2.three_center: ThreeCenterThing", "dfmp2.mp2.three_center: local_three_center",
        "dfmp2.mp2.three_center: three_center", "dfmp2.mp2.three_center: three_center_mo"]
    assert old_word_findings("dfmp2.mp2.b", "B = mnP = iaP = ovL = 0\n") == []


@pytest.mark.parametrize("module", sorted(DEPRECATED))
def test_the_deprecated_aliases_warn_and_hand_the_new_object(module):
    imported = importlib.import_module(module)
    assert set(imported.OLD_NAMES) == DEPRECATED[module]
    for old, new in imported.OLD_NAMES.items():
        with pytest.warns(DeprecationWarning, match=new):
            assert getattr(imported, old) is getattr(imported, new)
    with pytest.raises(AttributeError):
        getattr(imported, "ThreeCenterNothing")
