"""Subnormal fp32 results are flushed to zero in every thread that runs dfmp2's torch GEMMs, and a
run says so where they cannot be (torch's pool started before dfmp2). Products that underflow
cost x86 CPUs a microcode assist each: on C16H34/cc-pVDZ the fp32 exchange builds ran 4x slower
with them (docs/scf.md). Each case runs in a fresh process: the flag is a thread's own, and a
thread copies it from the thread that starts it."""

import os
import subprocess
import sys

import pytest

from conftest import ROOT

# every element of tiny @ tiny is a sum of 512 products of 1e-42: subnormal, unless flushed
GEMM = "t = torch.full((512, 512), 1e-21, dtype=torch.float32); out = (t @ t)"


def run_python(code):
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_a_backend_flushes_subnormals_in_every_thread():
    """After the backend is made, a threaded GEMM whose results are all subnormal gives zeros
    (without the flag: 5.1e-40 everywhere), on two threads, and the backend says so."""
    out = run_python("import torch; torch.set_num_threads(2)\n"
                     "from dfmp2.kernels import get_backend\n"
                     "backend = get_backend('cpu', 'fp32')\n"
                     f"{GEMM}\n"
                     "print(int(torch.count_nonzero(out)), 'flushed' in backend.describe(), len(backend.notes))")
    assert out == ["0", "True", "0"]


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs a second core for torch's worker thread")
def test_a_pool_started_before_dfmp2_is_announced():
    """torch's workers started before the flag keep subnormals: the backend's notes (recorded in
    the result) say so, and its description does not claim the flag."""
    out = run_python("import torch; torch.set_num_threads(2)\n"
                     "a = torch.randn(1000, 1000); (a @ a).sum()\n"
                     "from dfmp2.kernels import get_backend\n"
                     "backend = get_backend('cpu', 'fp32')\n"
                     f"{GEMM}\n"
                     "print(int(torch.count_nonzero(out)) > 0, 'flushed' in backend.describe(), "
                     "any('not flushed' in note for note in backend.notes))")
    assert out == ["True", "False", "True"]


def test_a_run_flushes_them_in_the_threads_pyscf_starts_first(tmp_path):
    """`dfmp2 run` as typed: PySCF's OpenMP regions in the SCF's set-up start the thread pool that
    torch's GEMMs share (torch's libgomp comes first in the symbol scope), so the flag is set
    before them: the record says the subnormals are flushed and carries no note that they are not."""
    proc = subprocess.run([sys.executable, "-m", "dfmp2", "run", os.path.join(ROOT, "examples", "water.xyz"),
                           "--json", str(tmp_path / "out.json"), "--quiet"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr
    import json

    record = json.loads((tmp_path / "out.json").read_text())
    assert "subnormals flushed to zero" in record["device_description"]
    assert not any("not flushed" in note for note in record["notes"])
