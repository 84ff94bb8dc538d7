"""Fault injection for tests that stop real runs: with DFMP2_TEST_PAIR_DELAY=SECONDS in the
environment (and this directory on PYTHONPATH), each pair-energy block of the torch backend
first sleeps that long, so that a test can stop the process in the middle of the pair stage
at a predictable point; with DFMP2_TEST_PAIR_MARK=PATH as well, the first block creates PATH
before it sleeps (the test then knows the run is in its pair stage). DFMP2_TEST_SCF_DELAY and
DFMP2_TEST_SCF_MARK do the same at the start of PySCF's SCF iterations; DFMP2_TEST_PAIR_RELEASE /
DFMP2_TEST_SCF_RELEASE=PATH end those waits as soon as PATH exists (the test lets the run go on).
Scratch ownership (tests/test_scratch_ownership.py): DFMP2_TEST_SCRATCH_KIND=KIND (a kind of
dfmp2.util.scratch.scratch_directory: scf, gradient, pyscf, ...) with DFMP2_TEST_SCRATCH_MARK=PATH
and DFMP2_TEST_SCRATCH_DELAY=SECONDS: once the first scratch directory of that kind is made, PATH
is created and the run sleeps; DFMP2_TEST_LOCK_MARK=PATH with DFMP2_TEST_LOCK_RELEASE=PATH2: before
taking a checkpoint's lock the run creates PATH and waits until PATH2 exists; DFMP2_TEST_SCF_ON_DISK=1:
dfmp2's SCF builds find no room in the budget for the JK-fit integrals (their scratch file, as
under a small --max-memory). Nothing else changes; without the variables this file does nothing."""

import os


def _wait(seconds, release=None):
    """Sleep `seconds`, or until the file `release` exists where one is named."""
    import time

    end = time.monotonic() + seconds
    while not (release and os.path.exists(release)):
        left = end - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(left, 0.02) if release else left)


if os.environ.get("DFMP2_TEST_SCRATCH_KIND"):
    from dfmp2.util import scratch as _scratch

    _kind = os.environ["DFMP2_TEST_SCRATCH_KIND"]
    _made = _scratch.scratch_directory

    def _marked_scratch_directory(kind, *args, **kwargs):
        made = _made(kind, *args, **kwargs)
        if kind in (_kind, f"dfmp2-{_kind}-") and not os.path.exists(os.environ["DFMP2_TEST_SCRATCH_MARK"]):
            open(os.environ["DFMP2_TEST_SCRATCH_MARK"], "a").close()  # (kind: a prefix before issue 72)
            _wait(float(os.environ.get("DFMP2_TEST_SCRATCH_DELAY", "60")))
        return made

    _scratch.scratch_directory = _marked_scratch_directory

if os.environ.get("DFMP2_TEST_LOCK_MARK"):
    from dfmp2.run.checkpoint import directory as _checkpoint

    _acquire_lock = _checkpoint.Checkpoint._acquire_lock

    def _waiting_acquire_lock(self):
        open(os.environ["DFMP2_TEST_LOCK_MARK"], "a").close()
        _wait(120, os.environ["DFMP2_TEST_LOCK_RELEASE"])
        return _acquire_lock(self)

    _checkpoint.Checkpoint._acquire_lock = _waiting_acquire_lock

if os.environ.get("DFMP2_TEST_SCF_ON_DISK"):
    from dfmp2.chem import jk as _jk

    _jk.FittedCoulombExchange._free_bytes = lambda self: 0

if os.environ.get("DFMP2_TEST_PAIR_DELAY"):
    from dfmp2.kernels.torch import backend as torch_backend

    _delay = float(os.environ["DFMP2_TEST_PAIR_DELAY"])
    _mark = os.environ.get("DFMP2_TEST_PAIR_MARK")
    _pair_energy = torch_backend.TorchBackend.pair_energy

    def _slow_pair_energy(self, *args, **kwargs):
        if _mark:
            open(_mark, "a").close()
        _wait(_delay, os.environ.get("DFMP2_TEST_PAIR_RELEASE"))
        return _pair_energy(self, *args, **kwargs)

    torch_backend.TorchBackend.pair_energy = _slow_pair_energy

if os.environ.get("DFMP2_TEST_SCF_DELAY"):  # the same in the SCF: its first iteration waits (marking SCF_MARK)
    from pyscf.scf import hf

    _scf_delay = float(os.environ["DFMP2_TEST_SCF_DELAY"])
    _scf_mark = os.environ.get("DFMP2_TEST_SCF_MARK")
    _scf = hf.SCF.scf

    def _slow_scf(self, *args, **kwargs):
        if _scf_mark:
            open(_scf_mark, "a").close()
        _wait(_scf_delay, os.environ.get("DFMP2_TEST_SCF_RELEASE"))
        return _scf(self, *args, **kwargs)

    hf.SCF.scf = _slow_scf
