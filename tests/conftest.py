"""Shared fixtures: small molecules, converged PySCF references and PySCF's own DF-MP2."""

import json
import os
import signal

import pytest

pyscf = pytest.importorskip("pyscf")
from pyscf import df, gto, scf  # noqa: E402
from pyscf.mp import dfmp2 as pyscf_dfmp2  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# Published DF-MP2 reference energies (PySCF and gpu4pyscf test suites), copied from the
# project's shared/reference/energies.json; test_reference_copy_is_current checks the copy.
REFERENCE_FILE = os.path.join(HERE, "data", "reference_energies.json")
SHARED_REFERENCE_FILE = os.path.join(ROOT, "..", "shared", "reference", "energies.json")

MOLECULES = {  # Angstrom
    "water": "O 0 0 0.1173; H 0 0.7572 -0.4692; H 0 -0.7572 -0.4692",
    "ammonia": "N 0 0 0.1129; H 0 0.9377 -0.2633; H 0.8121 -0.4689 -0.2633; H -0.8121 -0.4689 -0.2633",
    "methane": "C 0 0 0; H 0.6291 0.6291 0.6291; H -0.6291 -0.6291 0.6291; "
               "H -0.6291 0.6291 -0.6291; H 0.6291 -0.6291 -0.6291",
    "ethylene": "C 0 0 0.6695; C 0 0 -0.6695; H 0 0.9289 1.2321; H 0 -0.9289 1.2321; "
                "H 0 0.9289 -1.2321; H 0 -0.9289 -1.2321",
    "hf": "F 0 0 0; H 0 0 0.9168",
}

_SCF_CACHE = {}


@pytest.fixture(autouse=True)
def _signal_dispositions_restored():
    """The CLI's `main`, called in-process by some tests, leaves SIGINT/SIGTERM/SIGHUP ignored
    once a run has succeeded (it is the process's entry point: a late signal must not turn a
    finished run into a failure). Restored after each test, or every later subprocess would
    inherit the ignores (and a Ctrl-C test would find its child deaf to SIGINT)."""
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    saved = {signum: signal.getsignal(signum) for signum in signals}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def converged_rhf(name, basis="cc-pvdz", scf_mode="exact", atom=None, unit="Angstrom",
                  conv_tol=1e-12):
    """A tightly converged PySCF RHF (cached per set-up)."""
    key = (name, basis, scf_mode, atom, unit, conv_tol)
    if key not in _SCF_CACHE:
        mol = gto.M(atom=atom or MOLECULES[name], unit=unit, basis=basis, verbose=0)
        mf = scf.RHF(mol)
        if scf_mode == "df":
            mf = mf.density_fit()
        mf.conv_tol = conv_tol
        mf.kernel()
        assert mf.converged
        _SCF_CACHE[key] = mf
    return _SCF_CACHE[key]


def pyscf_reference(mf, auxbasis, frozen=None):
    """PySCF's DFMP2 with an explicit MP2 auxiliary basis -> (e_corr, e_os, e_ss)."""
    pt = pyscf_dfmp2.DFMP2(mf, frozen=frozen)
    pt.with_df = df.DF(mf.mol, auxbasis=auxbasis)
    pt.kernel()
    return pt.e_corr, pt.e_corr_os, pt.e_corr_ss


def mp2fit_auxbasis(mol):
    return df.make_auxbasis(mol, mp2fit=True)


def load_reference_cases():
    with open(REFERENCE_FILE, encoding="utf-8") as handle:
        return json.load(handle)["cases"]


@pytest.fixture
def arrays_only_budget(monkeypatch):
    """For in-process tests of tight plans (disk storage, smallest blocks): --max-memory counts
    the pipeline's arrays only, as if the process had no footprint of its own. The pytest
    process's resident set drifts by megabytes between calls, more than a tight plan's slack;
    the whole-process budget is tested on real runs in test_memory_budget.py."""
    from dfmp2 import memory

    monkeypatch.setattr(memory, "resident_bytes", lambda: 0)
