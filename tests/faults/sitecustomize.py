"""Fault injection for tests that stop real runs: with DFMP2_TEST_PAIR_DELAY=SECONDS in the
environment (and this directory on PYTHONPATH), each pair-energy block of the torch backend
first sleeps that long, so that a test can stop the process in the middle of the pair stage
at a predictable point; with DFMP2_TEST_PAIR_MARK=PATH as well, the first block creates PATH
before it sleeps (the test then knows the run is in its pair stage). DFMP2_TEST_SCF_DELAY and
DFMP2_TEST_SCF_MARK do the same at the start of PySCF's SCF iterations. Nothing else changes;
without the variables this file does nothing."""

import os

if os.environ.get("DFMP2_TEST_PAIR_DELAY"):
    import time

    from dfmp2.kernels import torch_backend

    _delay = float(os.environ["DFMP2_TEST_PAIR_DELAY"])
    _mark = os.environ.get("DFMP2_TEST_PAIR_MARK")
    _pair_energy = torch_backend.TorchBackend.pair_energy

    def _slow_pair_energy(self, *args, **kwargs):
        if _mark:
            open(_mark, "a").close()
        time.sleep(_delay)
        return _pair_energy(self, *args, **kwargs)

    torch_backend.TorchBackend.pair_energy = _slow_pair_energy

if os.environ.get("DFMP2_TEST_SCF_DELAY"):  # the same in the SCF: its first iteration waits (marking SCF_MARK)
    import time

    from pyscf.scf import hf

    _scf_delay = float(os.environ["DFMP2_TEST_SCF_DELAY"])
    _scf_mark = os.environ.get("DFMP2_TEST_SCF_MARK")
    _scf = hf.SCF.scf

    def _slow_scf(self, *args, **kwargs):
        if _scf_mark:
            open(_scf_mark, "a").close()
        time.sleep(_scf_delay)
        return _scf(self, *args, **kwargs)

    hf.SCF.scf = _slow_scf
