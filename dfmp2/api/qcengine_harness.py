"""dfmp2 as a QCEngine program, run in this process through `qcschema.run_qcschema`.

    import qcengine, dfmp2
    dfmp2.register_qcengine()                    # once; again is harmless
    out = qcengine.compute({"molecule": ..., "driver": "energy",
                            "model": {"method": "mp2", "basis": "cc-pvdz"}, "keywords": {}}, "dfmp2")

Methods, drivers and keywords: `qcschema`. QCEngine's task config gives one more limit of the
memory budget (config.memory GiB, `task_memory`: the smallest of all limits wins; QCEngine's
figure, by default most of the machine's memory, never raises the budget above a cgroup's or an
rlimit's; the keyword max_memory is the user's own figure), the scratch directory unless the
keywords set it, and the threads: the run's torch, OpenMP (PySCF's and torch's) and BLAS thread
pools hold config.ncores threads, and are restored afterwards (`threads`). A failed run raises
QCEngine's exception of its error type (`qcschema.ERROR_TYPES`: InputError, ResourceError,
ConvergenceError, else UnknownError), which qcengine.compute turns into a FailedOperation of that type.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Any, ClassVar

from qcengine.exceptions import ConvergenceError, ResourceError, UnknownError
from qcengine.exceptions import InputError as QCEngineInputError
from qcengine.programs.model import ProgramHarness

from ..run.budget import caller_limit
from ..util.system_memory import MB
from ..util.version import __version__
from .qcschema import run_qcschema

NAME = "dfmp2"  # QCEngine's program name
RAISED = {"input_error": QCEngineInputError, "resource_error": ResourceError, "convergence_error": ConvergenceError}


class DFMP2Harness(ProgramHarness):
    """QCEngine's ProgramHarness for dfmp2 (in-process; QCSchema v2 models in and out)."""

    _defaults: ClassVar[dict[str, Any]] = {
        "name": NAME, "scratch": True, "thread_safe": False, "thread_parallel": True,
        "node_parallel": False, "managed_memory": True,
    }

    @staticmethod
    def found(raise_error: bool = False) -> bool:
        """dfmp2's own dependencies (PySCF, torch) importable."""
        from qcelemental.util import which_import

        return all(which_import(module, return_bool=True, raise_error=raise_error,
                                raise_msg=f"dfmp2 needs {module}: pip install dfmp2") for module in ("pyscf", "torch"))

    def get_version(self) -> str:
        from qcelemental.util import safe_version

        return safe_version(__version__)

    def compute(self, input_data, config):
        """Run input_data (qcelemental.models.v2.AtomicInput) -> v2 AtomicResult; QCEngine's
        exception of the error type (RAISED, else UnknownError) for a FailedOperation."""
        from qcelemental.models.v2 import AtomicResult

        plain = input_data.model_dump(mode="json")
        keywords = plain["specification"]["keywords"]
        if "scratch" not in keywords and config.scratch_directory:
            keywords["scratch"] = str(config.scratch_directory)
        with threads(config.ncores), task_memory(config.memory):
            out = run_qcschema(plain)
        if not out["success"]:
            error = out["error"]
            raise RAISED.get(error["error_type"], UnknownError)(error["error_message"])
        return AtomicResult(input_data=input_data, molecule=input_data.molecule, properties=out["properties"],
                            return_result=out["return_result"], provenance=out["provenance"],
                            extras={"dfmp2": out["extras"]["dfmp2"]}, stdout=None, native_files={}, success=True)


def task_memory(memory_gib):
    """Within: QCEngine's task memory (GiB; None: none) is one more limit of every budget."""
    if memory_gib is None:
        return nullcontext()
    size = int(float(memory_gib) * 1024 ** 3)
    return caller_limit(size, f"QCEngine's task_config memory {float(memory_gib):g} GiB: {size / MB:.0f} MB")


@contextmanager
def threads(ncores):
    """Within: torch's intra-op threads, every OpenMP runtime loaded (PySCF's, torch's) and every
    BLAS library (numpy's, SciPy's) at `ncores` threads (None: as they are); after: as before."""
    if ncores is None:
        yield
        return
    import scipy.linalg  # noqa: F401 (its BLAS loaded now, so that the limit reaches it)
    import torch
    from threadpoolctl import threadpool_limits

    from .. import chem

    ncores = int(ncores)
    torch_before = torch.get_num_threads()
    with chem.pyscf_threads(ncores), threadpool_limits(limits=ncores):  # PySCF's OpenMP loaded first: limited too
        torch.set_num_threads(ncores)
        try:
            yield
        finally:
            torch.set_num_threads(torch_before)


def register() -> DFMP2Harness:
    """Register dfmp2 with QCEngine as program "dfmp2" (once: a second call returns the harness
    already registered)."""
    import qcengine

    if NAME in qcengine.list_all_programs():
        return qcengine.get_program(NAME, check=False)
    harness = DFMP2Harness()
    qcengine.register_program(harness)
    return harness
