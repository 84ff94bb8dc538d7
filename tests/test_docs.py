"""The documentation names only files that exist, the README stays a short user guide, and the
README still holds the two commands the CI script runs."""

import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# CHANGELOG.md is exempt: history may name files that are gone.
DOC_FILES = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
# named before it is written (another change adds it); none now
ALLOWED_MISSING = set()
README_MAX_LINES = 270

# a relative path into the repository: one of its top-level folders, then path characters
# (glob characters * and ? included); not part of a longer path, URL or dotted name
PATH = re.compile(r"(?<![\w./~$-])((?:dfmp2|benchmarks|tools|tests|docs|examples|infra|\.ci)/[\w./*?-]*)")


def named_paths(text):
    """Path-like tokens of a markdown text, without trailing punctuation, #anchors or :line."""
    paths = set()
    for match in PATH.finditer(text):
        token = match.group(1).split("#", 1)[0]
        token = re.sub(r"(:\d+)+$", "", token)
        token = token.rstrip(".,;:!?)")
        if token:
            paths.add(token)
    return paths


def exists(token):
    full = os.path.join(ROOT, token)
    if any(c in token for c in "*?"):
        return bool(glob.glob(full))
    return os.path.exists(full)


def test_path_extraction():
    text = ("see `dfmp2/mp2/pipeline.py:120`, [docs/benchmarks.md](docs/benchmarks.md#calibration), "
            "benchmarks/results/*.json. Not https://example.org/docs/x.md, pyscf/mp/test/ or a.dfmp2/x.")
    assert named_paths(text) == {"dfmp2/mp2/pipeline.py", "docs/benchmarks.md", "benchmarks/results/*.json"}


@pytest.mark.parametrize("name", DOC_FILES)
def test_named_paths_exist(name):
    with open(os.path.join(ROOT, name), encoding="utf-8") as handle:
        text = handle.read()
    missing = sorted(p for p in named_paths(text) if p not in ALLOWED_MISSING and not exists(p))
    assert not missing, f"{name} names paths that do not exist: {missing}"


def test_readme_is_short():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"


def test_readme_holds_the_commands_ci_runs():
    """`.ci/run` runs the README's commands ("README, command N"): each must be in the README
    verbatim, as a line of a bash block."""
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as handle:
        ci = handle.read().splitlines()
    commands = [ci[i + 1].strip() for i, line in enumerate(ci)
                if re.match(r"#\s*README, command \d+", line.strip()) and i + 1 < len(ci)]
    assert len(commands) == 2, commands
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as handle:
        readme = handle.read()
    blocks = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)
    lines = {line.strip() for block in blocks for line in block.splitlines()}
    for command in commands:
        assert command in lines, f"README.md lacks the command .ci/run runs: {command}"


# a Python name under the package: dfmp2.NAME[.NAME...] not inside a path or a longer dotted name
PYTHON_NAME = re.compile(r"(?<![\w./-])dfmp2\.([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")


def python_names(text):
    return {match.group(1) for match in PYTHON_NAME.finditer(text)}


def resolves(dotted) -> bool:
    """dfmp2.<dotted> is an attribute or module that exists (modules imported as needed)."""
    import importlib

    obj, prefix = importlib.import_module("dfmp2"), "dfmp2"
    for part in dotted.split("."):
        prefix = f"{prefix}.{part}"
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        try:
            obj = importlib.import_module(prefix)
        except ImportError:
            return False
    return True


@pytest.mark.parametrize("name", DOC_FILES)
def test_named_python_objects_exist(name):
    """docs/cli.md cited dfmp2.run_xyz, which did not exist (AttributeError): every dfmp2.NAME a
    document names resolves (files like dfmp2.lock are names inside paths, not matched)."""
    with open(os.path.join(ROOT, name), encoding="utf-8") as handle:
        text = handle.read()
    missing = sorted(n for n in python_names(text) if not resolves(n))
    assert not missing, f"{name} names dfmp2 objects that do not exist: {missing}"
