"""dfmp2.DFMP2 as a drop-in for pyscf.mp.dfmp2.DFMP2: a PySCF script run unchanged except its
import gives PySCF's numbers; PySCF's conventions (kernel() -> (e_corr, t2), with_df, mo_coeff,
frozen, logger) hold."""

import io
import subprocess
import sys

import numpy as np
import pytest

from conftest import converged_rhf
from dfmp2 import DFMP2, InputError
from pyscf import df, gto, lib, scf
from pyscf.mp import dfmp2 as pyscf_dfmp2

SCRIPT = '''
import numpy as np
from pyscf import gto, scf, df
{import_line}

mol = gto.M(atom="O 0 0 0.1173; H 0 0.7572 -0.4692; H 0 -0.7572 -0.4692", basis="cc-pvdz", verbose=0)
mf = scf.RHF(mol).run(conv_tol=1e-12)
pt = DFMP2(mf, frozen=1)
e_corr, t2 = pt.kernel()
print("A", float(e_corr), t2 is None)
pt = DFMP2(mf).run()
print("B", float(pt.e_corr), float(pt.e_tot), float(pt.e_corr_os), float(pt.e_corr_ss))
mfd = scf.RHF(mol).density_fit().run(conv_tol=1e-12)
pt = DFMP2(mfd)
pt.with_df = df.DF(mol, auxbasis="cc-pvdz-ri")
e, t2 = pt.kernel(with_t2=True)
print("C", float(e), t2.shape, float(np.abs(t2).sum()))
'''


def _run(import_line):
    proc = subprocess.run([sys.executable, "-c", SCRIPT.format(import_line=import_line)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in proc.stdout.splitlines()}


def test_pyscf_script_unchanged_except_the_import():
    ours = _run("from dfmp2 import DFMP2")
    theirs = _run("from pyscf.mp.dfmp2 import DFMP2")
    for key in ("A", "B", "C"):
        a = [float(x) for x in ours[key].replace("(", " ").replace(")", " ").replace(",", " ").split()
             if x not in ("True", "False")]
        b = [float(x) for x in theirs[key].replace("(", " ").replace(")", " ").replace(",", " ").split()
             if x not in ("True", "False")]
        assert np.allclose(a, b, rtol=0, atol=1e-8), (key, ours[key], theirs[key])
    assert ours["A"].endswith("True")


def test_with_df_is_honoured_and_the_jk_fit_set_is_not_reused_by_default():
    mf = converged_rhf("water", scf_mode="df")
    default = DFMP2(mf).run()
    assert default.result.auxbasis == "cc-pvdz-ri"
    pt = DFMP2(mf)
    pt.with_df = df.DF(mf.mol)  # unset auxbasis: what PySCF's DF builds, the JK-fit set
    pt.kernel()
    ref = pyscf_dfmp2.DFMP2(mf)  # PySCF reuses the SCF's DF object (JK-fit)
    ref.kernel()
    assert abs(pt.e_corr - ref.e_corr) < 1e-8 and abs(default.e_corr - ref.e_corr) > 1e-6


def test_mo_coeff_and_logger_follow_pyscf():
    mf = converged_rhf("water")
    rotated = mf.mo_coeff.copy()
    rotated[:, [1, 2]] = rotated[:, [2, 1]]  # swap two occupied orbitals: same energy
    energies = mf.mo_energy.copy()
    energies[[1, 2]] = energies[[2, 1]]
    ref = pyscf_dfmp2.DFMP2(mf)
    ref.with_df = df.DF(mf.mol, auxbasis="cc-pvdz-ri")
    ref.kernel()
    pt = DFMP2(mf, mo_coeff=rotated)
    e, _ = pt.kernel(mo_energy=energies)
    assert abs(e - ref.e_corr) < 1e-8
    out = io.StringIO()
    pt = DFMP2(mf)
    pt.stdout, pt.verbose = out, lib.logger.INFO
    pt.kernel()
    assert "E(DFMP2) =" in out.getvalue() and "frozen orbitals" in out.getvalue()
    assert isinstance(pt, lib.StreamObject) and pt.run() is pt


def test_with_t2_refused_when_it_would_not_fit(arrays_only_budget):
    mf = converged_rhf("ethylene")
    pt = DFMP2(mf)
    pt.max_memory = 2.0  # MB: enough for the energy (needs 1.63 MB), not for t2 (0.82 MB) as well
    with pytest.raises(InputError, match="with_t2: t2 needs 0.8192 MB"):
        pt.kernel(with_t2=True)
    assert pt.kernel()[0] < 0


def test_gpu4pyscf_mean_field_is_moved_to_the_cpu():
    """gpu4pyscf is not installed here: a stand-in class from a module named gpu4pyscf with
    to_cpu() (what mf.to_gpu() objects provide); the move is recorded in the result."""
    mf = converged_rhf("water")
    gpu_cls = type("RHF", (), {"__module__": "gpu4pyscf.scf.hf", "to_cpu": lambda self: mf})
    pt = DFMP2(gpu_cls()).run()
    assert abs(pt.e_corr - DFMP2(mf).run().e_corr) < 1e-12
    assert any("gpu4pyscf" in note for note in pt.result.notes)
    bare = type("RHF", (), {"__module__": "gpu4pyscf.scf.hf"})
    with pytest.raises(InputError, match="to_cpu"):
        DFMP2(bare())


def test_unrestricted_alias():
    from dfmp2 import DFUMP2

    mol = gto.M(atom="O 0 0 0; H 0 0 0.97", basis="cc-pvdz", spin=1, verbose=0)
    mf = scf.UHF(mol).run(conv_tol=1e-11)
    assert DFUMP2(mf).run().reference == "uhf"
