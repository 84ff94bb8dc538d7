"""The run's decisions logged where they are made (`dfmp2.util.log`): `--debug` shows the memory
plan, the metric's factorisation and the screening choice on standard error; a run without it
writes nothing there."""

import os
import subprocess
import sys

from conftest import ROOT


def _run(*extra):
    return subprocess.run([sys.executable, "-m", "dfmp2", "run", os.path.join(ROOT, "examples", "water.xyz"), "--quiet", *extra],
                          capture_output=True, text=True, timeout=300)


def test_debug_shows_each_decision_where_it_is_made():
    shown, plain = _run("--debug"), _run()
    assert shown.returncode == plain.returncode == 0
    lines = shown.stderr.splitlines()
    assert any(line.startswith("dfmp2: memory plan: budget ") and "(ia|P) in memory, aux block " in line
               for line in lines)
    assert any(line.startswith("dfmp2: metric (P|Q) [84, 84]: Cholesky") for line in lines)  # cc-pvdz-ri
    assert any(line.startswith("dfmp2: screening of the mp2 integrals: off (") for line in lines)
    assert any(line.startswith("dfmp2: CPU product ") for line in lines)  # (kernels.torch.cpu_gemm)
    assert plain.stderr == ""
