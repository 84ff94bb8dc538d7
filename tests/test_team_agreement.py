"""The ranks of a team agree on their run before any work (issue 72): ranks started with different
inputs (a moved atom, another basis, --precision, --frozen-core) all stop with exit 2 and one line
naming what differs, leaving nothing behind; what a rank may have of its own (its budget, scratch,
--json, --quiet) still runs, with the tightest rank's memory plan; and the digest holds each input
that changes the run and deliberately not the others."""

import importlib
import json
import os
import subprocess
import sys
from dataclasses import fields

import numpy as np
import pytest
from pyscf import gto

from dfmp2 import chem
from dfmp2.api.driver import run_xyz
from dfmp2.kernels import backend_for
from dfmp2.run import ranks
from dfmp2.run.settings import Settings
from dfmp2.util.errors import ComputationError, InputError

from conftest import MOLECULES, ROOT
from test_distributed import EXAMPLES, by_hand

WATER = os.path.join(EXAMPLES, "water.xyz")


# ----------------------------------------------------------------------------- the digest

def agreement():
    """dfmp2.api.agreement, imported where used: the two-rank tests also run on code without it."""
    return importlib.import_module("dfmp2.api.agreement")


def digest_of(atom=MOLECULES["water"], basis="cc-pvdz", charge=0, spin=0, **changes):
    """The digest the driver makes of a water run (its molecule built as PySCF would, the fitting sets
    PySCF pairs with the basis, the backend the settings ask for)."""
    settings = Settings(basis=basis, charge=charge, spin=spin, **changes)
    mol = gto.M(atom=atom, basis=basis, charge=charge, spin=spin, verbose=0)
    return agreement().run_digest(mol, settings, chem.MNPIntegrals(mol, settings.auxbasis),
                                  backend_for(settings), chem.fitting_basis(mol, mp2fit=False))


def differing(**changes) -> dict:
    """{part: [aspects]} in which a run with `changes` differs from the plain water run."""
    return between({}, changes)


def between(ours: dict, theirs: dict) -> dict:
    """{part: [aspects]} in which a run with `theirs` (digest_of's keywords) differs from one with `ours`."""
    return ranks.differences(ranks.fingerprints(digest_of(**ours)), ranks.fingerprints(digest_of(**theirs)))


def test_every_settings_field_is_agreed_or_said_to_be_the_ranks_own():
    """A new Settings field must be decided on: in the digest, or per rank with its reason."""
    names = {field.name for field in fields(Settings)}
    agreed, per_rank = agreement().AGREED_SETTINGS, agreement().PER_RANK_SETTINGS
    assert set(agreed) | set(per_rank) == names and not set(agreed) & set(per_rank)
    assert all(len(reason) > 20 for reason in per_rank.values())


MOVED_O = "O 0 0 0.1573; H 0 0.7572 -0.4692; H 0 -0.7572 -0.4692"  # the O 0.04 A up (the case)


@pytest.mark.parametrize("changes, expected", [
    ({"atom": MOVED_O}, {"molecule": ["geometry"]}),
    ({"atom": "O 0 0 0.11730000000000002; H 0 0.7572 -0.4692; H 0 -0.7572 -0.4692"}, {"molecule": ["geometry"]}),
    ({"atom": "O 0 0 0.1173; H 0 -0.7572 -0.4692; H 0 0.7572 -0.4692"}, {"molecule": ["geometry"]}),
    ({"charge": 1, "spin": 1}, {"molecule": ["charge", "spin"], "settings": ["charge", "spin"]}),
    ({"basis": "sto-3g"}, {"basis sets": ["orbital basis", "MP2 fitting set", "JK fitting set"],
                           "settings": ["basis"]}),
    ({"auxbasis": "def2-universal-jkfit"}, {"basis sets": ["MP2 fitting set"], "settings": ["auxbasis"]}),
    ({"precision": "fp32"}, {"settings": ["precision"], "backend": ["precision"]}),
    ({"frozen_core": True}, {"settings": ["frozen_core"]}),
    ({"frozen": [0]}, {"settings": ["frozen"]}),
    ({"scf_max_cycle": 50, "gradient": True}, {"settings": ["scf_max_cycle", "gradient"]}),
    ({"checkpoint": "/some/where"}, {"settings": ["checkpoint"]}),
])
def test_the_digest_holds_each_input_that_changes_the_run(changes, expected):
    """Exact coordinates (a last-bit change is another geometry; two H swapped too: rank 1's atom k is
    not rank 0's). The sizes (another basis has other ones) are named only where nothing else differs."""
    assert differing(**changes) == expected


def test_ghosts_are_in_the_digest():
    """Two ranks each with one ghost H, another one: the same elements, coordinates and basis sets."""
    ghost_first = "O 0 0 0.1173; ghost-H 0 0.7572 -0.4692; H 0 -0.7572 -0.4692"
    ghost_last = "O 0 0 0.1173; H 0 0.7572 -0.4692; ghost-H 0 -0.7572 -0.4692"
    assert between({"atom": ghost_first, "spin": 1}, {"atom": ghost_last, "spin": 1}) == {"molecule": ["ghosts"]}


@pytest.mark.parametrize("changes", [{"max_memory": 1200}, {"scratch": "/node-local/tmp"}])
def test_what_a_rank_may_have_of_its_own_is_not_in_the_digest(changes):
    """Each rank's budget (the team takes the tightest plan) and node-local scratch; and the
    checkpoint's path, where one is given on every rank (rank 0 checks that they see one directory)."""
    assert differing(**changes) == {}
    assert between({"checkpoint": "/mnt/a/ck"}, {"checkpoint": "/shared/ck"}) == {}


def test_frozen_core_is_compared_as_asked_not_as_resolved():
    """With frozen_core the driver sets frozen to the core's count (from the molecule, agreed): the
    digest compares the request, so a rank's resolved settings equal another's unresolved ones."""
    assert between({"frozen_core": True}, {"frozen_core": True, "frozen": 1}) == {}


def test_the_mean_field_digest_adds_the_kind_of_mean_field():
    from pyscf import scf

    mol = gto.M(atom=MOLECULES["water"], basis="sto-3g", verbose=0)
    settings = Settings()
    rhf, uhf = scf.RHF(mol), scf.UHF(mol)
    rhf.mo_coeff, uhf.mo_coeff = np.zeros((7, 7)), np.zeros((2, 7, 7))  # (not run: the digest reads their shapes)
    digests = [ranks.fingerprints(agreement().mean_field_digest(mf, settings, None, backend_for(settings)))
               for mf in (rhf, uhf)]
    assert ranks.differences(*digests) == {"mean field": ["reference"]}  # (sizes, derived, named only alone)


def test_a_difference_is_one_line_naming_it():
    base = ranks.fingerprints(digest_of())
    moved = ranks.fingerprints(digest_of(atom=MOVED_O))
    other = ranks.fingerprints(digest_of(basis="sto-3g", precision="fp32"))
    error = ranks.disagreement([("digest", base), ("digest", moved)])
    assert isinstance(error, InputError) and str(error).startswith("rank 1's molecule differs from rank 0's (geometry)")
    error = ranks.disagreement([("digest", base), ("digest", base), ("digest", other)])
    assert str(error).startswith("rank 2's basis sets (orbital basis, MP2 fitting set, JK fitting set), settings "
                                 "(basis, precision) and backend (precision) differ from rank 0's")
    assert "\n" not in str(error) and ranks.disagreement([("digest", base), ("digest", base)]) is None
    sizes = [("digest", {"sizes": {"fitting functions": size}}) for size in ("84", "85")]  # (fingerprints)
    assert str(ranks.disagreement(sizes)).startswith("rank 1's sizes differ from rank 0's (fitting functions)")


def test_a_rank_that_failed_before_the_agreement_is_named():
    bad = ranks.disagreement([("digest", {}), ("failed", "InputError", "missing.xyz: no such file")])
    assert isinstance(bad, InputError) and str(bad) == "rank 1: missing.xyz: no such file"
    broken = ranks.disagreement([("failed", "ValueError", "odd"), ("digest", {}), ("failed", "InputError", "x")])
    assert isinstance(broken, ComputationError) and not isinstance(broken, InputError)
    assert str(broken) == "rank 0 failed before the ranks agreed on the run: ValueError: odd (and 1 more rank)"


# ----------------------------------------------------------------------------- two real ranks

def moved_water(tmp_path):
    path = tmp_path / "moved.xyz"
    path.write_text("3\nwater, its O 0.04 A up\nO 0 0 0.1573\nH 0 0.7572 -0.4692\nH 0 -0.7572 -0.4692\n")
    return path


def two_ranks(tmp_path, monkeypatch, rank1_args):
    """Rank 0 on water.xyz (--json, --scratch of its own), rank 1 on `rank1_args` (its --scratch too),
    TMPDIR and PYSCF_TMPDIR pointed at a directory of the test, every rank waiting at most 120 s for
    the others: [(exit status, stderr)] of each, after checking that no scratch is left in any of
    the three and no --json was written."""
    roots = [tmp_path / name for name in ("scratch0", "scratch1", "tmp")]
    for root in roots:
        root.mkdir()
    monkeypatch.setenv("TMPDIR", str(roots[2]))
    monkeypatch.setenv("PYSCF_TMPDIR", str(roots[2]))
    out = tmp_path / "out.json"
    ranks = by_hand(tmp_path, lambda rank: ["--rank-timeout", 120, "--scratch", roots[rank],
                                            *([WATER, "--json", out] if rank == 0 else rank1_args)])
    assert [sorted(os.listdir(root)) for root in roots] == [[], [], []]
    assert not out.exists()
    return ranks


# the four: a moved atom (both ranks exited 0, E -84.343 Eh), another basis (exit 1, a
# tensor-shape RuntimeError), another --precision or --frozen-core (rank 0 aborted in gloo's C++)
@pytest.mark.parametrize("rank1, named", [
    (lambda tmp_path: [moved_water(tmp_path)], "rank 1's molecule differs from rank 0's (geometry)"),
    (lambda tmp_path: [WATER, "--precision", "fp64"], "settings (--precision) and backend (precision)"),
    (lambda tmp_path: [WATER, "--basis", "sto-3g"], "basis sets (orbital basis, MP2 fitting set, JK fitting set)"),
    (lambda tmp_path: [WATER, "--frozen-core"], "rank 1's settings differ from rank 0's (--frozen-core)"),
], ids=["geometry", "precision", "basis", "frozen-core"])
def test_ranks_given_different_inputs_all_stop_before_any_work(tmp_path, monkeypatch, rank1, named):
    (code0, err0), (code1, err1) = two_ranks(tmp_path, monkeypatch, rank1(tmp_path))
    assert (code0, code1) == (2, 2), (err0, err1)
    assert err0.startswith("dfmp2: error: ") and named in err0 and err0.strip().count("\n") == 0, err0
    assert "Traceback" not in err0 + err1 and err1.strip() == ""


def test_a_rank_whose_own_input_fails_stops_every_rank(tmp_path, monkeypatch):
    """Rank 1's molecule file is missing: it fails before it joins the team, and joins it to say so;
    rank 0 (which would wait --rank-timeout at the rendezvous) stops too, with rank 1's message."""
    (code0, err0), (code1, err1) = two_ranks(tmp_path, monkeypatch, ["missing.xyz"])
    assert (code0, code1) == (2, 2), (err0, err1)
    assert err0.strip() == "dfmp2: error: rank 1: missing.xyz: no such file" and err1.strip() == ""


def test_a_rank_whose_command_line_click_refuses_stops_every_rank(tmp_path, monkeypatch):
    """Rank 1's `--charge x` is refused by click before dfmp2's code runs: it still joins the team to
    say so, and rank 0 stops at once with its reason instead of waiting --rank-timeout."""
    (code0, err0), (code1, err1) = two_ranks(tmp_path, monkeypatch, [WATER, "--charge", "x"])
    assert (code0, code1) == (2, 2), (err0, err1)
    assert err0.startswith("dfmp2: error: rank 1: ") and "--charge" in err0 and err0.strip().count("\n") == 0, err0
    assert err1.strip() == ""


def test_a_rank_refused_after_joining_stops_every_rank(tmp_path, monkeypatch):
    """Rank 1 alone asks for a counterpoise correction, which runs in one process: it refuses after
    joining, before the ranks agreed; rank 0, waiting for the agreement, stops with its reason."""
    (code0, err0), (code1, err1) = two_ranks(tmp_path, monkeypatch, [WATER, "--counterpoise"])
    assert (code0, code1) == (2, 2), (err0, err1)
    assert err0.strip() == ("dfmp2: error: rank 1: counterpoise and extrapolated energies run in one process "
                            "(not under torchrun)") and err1.strip() == ""


def test_what_a_rank_may_have_of_its_own_still_runs_with_the_tightest_plan(tmp_path):
    """Each rank its own --max-memory and --scratch, rank 0 alone --json, rank 1 --quiet: the one-process
    energy, and every rank's blocks are those of rank 1's budget, the smaller (a rank planning from rank
    0's would exceed its own), which the record names."""
    scratch = [tmp_path / "scratch0", tmp_path / "scratch1"]
    for root in scratch:
        root.mkdir()
    out = tmp_path / "out.json"
    ranks = by_hand(tmp_path, lambda rank: [WATER, "--precision", "fp64", "--scratch", scratch[rank],
                                            *(["--json", out, "--max-memory", 3000] if rank == 0 else
                                              ["--quiet", "--max-memory", 1200])])
    assert [code for code, _ in ranks] == [0, 0], ranks
    record = json.loads(out.read_text())
    one = run_xyz(WATER)
    assert abs(record["e_tot"] - one.e_tot) < 1e-10 and abs(record["e_corr"] - one.e_corr) < 1e-10
    assert record["memory"]["budget_mb"] == 1200 and record["memory"]["budget_source"] == "--max-memory, rank 1's"
    assert [sorted(os.listdir(root)) for root in scratch] == [[], []]


DROP_IN = """
import json, os, sys
from pyscf import gto, scf
from dfmp2 import DFMP2
z = 0.1173 if os.environ["RANK"] == "0" else 0.1573  # rank 1's O 0.04 A up
mol = gto.M(atom=f"O 0 0 {z}; H 0 0.7572 -0.4692; H 0 -0.7572 -0.4692", basis="sto-3g", verbose=0)
mf = scf.RHF(mol).run()
try:
    DFMP2(mf).run()
    outcome = {"ran": True}
except Exception as error:
    outcome = {"error": type(error).__name__, "message": str(error)}
json.dump(outcome, open(sys.argv[1] + os.environ["RANK"], "w"))
"""


def test_drop_in_ranks_with_different_molecules_stop(tmp_path):
    """The PySCF drop-in under torchrun: every rank's script makes its own mean field, rank 0's
    orbitals are used, so a rank whose molecule differs would compute with rank 0's orbitals on its
    own geometry: every rank raises the InputError naming it before the broadcast."""
    script, out = tmp_path / "script.py", tmp_path / "outcome.json"
    script.write_text(DROP_IN)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           str(script), str(out)], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL, env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                              [ROOT, os.environ.get("PYTHONPATH", "")])))
    assert proc.returncode == 0, proc.stderr[-3000:]
    outcomes = [json.loads((tmp_path / f"outcome.json{rank}").read_text()) for rank in (0, 1)]
    assert [o.get("error") for o in outcomes] == ["InputError", "InputError"], outcomes
    assert outcomes[0]["message"].startswith("rank 1's molecule differs from rank 0's (geometry)")
