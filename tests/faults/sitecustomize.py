"""Fault injection for tests that kill real runs: with DFMP2_TEST_PAIR_DELAY=SECONDS in the
environment (and this directory on PYTHONPATH), each pair-energy block of the torch backend
first sleeps that long, so that a test can stop the process in the middle of the pair stage
at a predictable point. Nothing else changes; without the variable this file does nothing."""

import os

if os.environ.get("DFMP2_TEST_PAIR_DELAY"):
    import time

    from dfmp2.kernels import torch_backend

    _delay = float(os.environ["DFMP2_TEST_PAIR_DELAY"])
    _pair_energy = torch_backend.TorchBackend.pair_energy

    def _slow_pair_energy(self, *args, **kwargs):
        time.sleep(_delay)
        return _pair_energy(self, *args, **kwargs)

    torch_backend.TorchBackend.pair_energy = _slow_pair_energy
