"""Inputs the sixth hostile battery (issue 72) found taken wrongly: environment values that
crashed with a ValueError (exit 1) instead of one line naming the variable (exit 2), ... Each
test failed on 09f317c."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

from dfmp2.util import environment
from dfmp2.util.errors import InputError

WATER = Path(ROOT) / "examples" / "water.xyz"


# ----------------------------------------------------------------------------- environment values

BAD_NUMBERS = ["abc", "2.5", "\u00b2", "-1", "1e3", "0x10", " 4 4", "\u0664"]  # '²' and Arabic-Indic 4 are str.isdigit()


@pytest.mark.parametrize("name", sorted(environment.WHOLE_NUMBERS))
@pytest.mark.parametrize("value", BAD_NUMBERS)
def test_every_whole_number_variable_refuses_what_is_not_one(name, value):
    """The class: every variable dfmp2 reads as a number is judged in one place, and anything but
    ASCII digits is one line naming it."""
    with pytest.raises(InputError, match=rf"^environment variable {name}=.* is not a whole number"):
        environment.whole_number(name, environ={name: value})
    with pytest.raises(InputError, match=rf"^environment variable {name}="):
        environment.check_values(environ={name: value})


def test_whole_numbers_are_read_and_their_least_value_held():
    assert environment.whole_number("LOCAL_WORLD_SIZE", 1, environ={"LOCAL_WORLD_SIZE": " 4 "}) == 4
    assert environment.whole_number("LOCAL_WORLD_SIZE", 1, environ={}) == 1
    assert environment.whole_number("SLURM_MEM_PER_NODE", environ={"SLURM_MEM_PER_NODE": "0"}) == 0
    with pytest.raises(InputError, match="from 1"):
        environment.whole_number("WORLD_SIZE", environ={"WORLD_SIZE": "0"})


@pytest.mark.parametrize("variable", ["LOCAL_WORLD_SIZE=abc", "LOCAL_WORLD_SIZE=2.5", "SLURM_MEM_PER_CPU=\u00b2",
                                      "SLURM_MEM_PER_GPU=lots", "WORLD_SIZE=two"])
def test_a_bad_environment_value_is_one_line_and_exit_2(tmp_path, variable):
    """LOCAL_WORLD_SIZE=abc or 2.5, SLURM_MEM_PER_CPU=² were exit 1 with a ValueError."""
    name, value = variable.split("=")
    proc = subprocess.run([sys.executable, "-m", "dfmp2.app.cli", "run", str(WATER), "--json", "out.json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, name: value})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and f"{name}=" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out.json").exists()


def test_the_api_refuses_a_bad_environment_value_before_the_scf(monkeypatch):
    import dfmp2
    from dfmp2.chem import Atom

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "abc")
    atoms = [Atom("H", (0.0, 0.0, 0.0)), Atom("H", (0.0, 0.0, 0.74))]
    with pytest.raises(InputError, match="LOCAL_WORLD_SIZE"):
        dfmp2.run_atoms(atoms)
