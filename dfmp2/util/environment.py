"""The environment variables dfmp2 reads or sets: the one module that touches `os.environ`.

VARIABLES names each one, with who sets it and what dfmp2 uses it for; `get` and `is_set` read
them, `set_default` sets one where it is not set (the thread policies at import, a rank's
NeuronCore, neuronx-cc's LNC degree). A name that is not in VARIABLES is a KeyError: a new
variable is named here first. Each function takes `environ` (a mapping standing in for the
process's environment, for tests; None: os.environ, read when called).

    get("LOCAL_WORLD_SIZE", "1")               -> "4" under torchrun --nproc-per-node 4
    set_default("OMP_WAIT_POLICY", "PASSIVE")  -> True where dfmp2 set it, False where it was set
"""

from __future__ import annotations

import os

from .errors import InputError

_RECORDED = "the user: recorded with a result, a CPU run's speed depends on it (util.cpu_config)"
_THREADS = "the user, else dfmp2 at import (util.cpu_config.THREAD_DEFAULTS): idle threads' policy; recorded"
_SLURM = "Slurm (srun/sbatch): the job's memory on this node, a limit of the memory budget (util.memory_limits)"
_RENDEZVOUS = "torchrun, or the user under srun: present before a rank joins the process group (run.ranks)"

VARIABLES = {
    # scratch
    "PYSCF_TMPDIR": "the user (PySCF's setting): where scratch directories go, before TMPDIR (util.scratch)",
    "TMPDIR": "the user or the batch system: where scratch directories go unless --scratch or PYSCF_TMPDIR says; "
              "checked as PYSCF_TMPDIR is, never passed over (util.scratch.scratch_root)",
    # the CPU configuration (util.cpu_config)
    "DFMP2_SCF_FP64_SQUARE": "the user, 1 or 0: overrides the CPU table's choice of the SCF's fp64 square copy of B",
    "DFMP2_GEMM": "the user: the library every CPU product of a precision runs on, instead of measuring "
                  "(`onednn`, or `fp32=onednn,fp64=openblas`; util.cpu_config.gemm_pins)",
    "DFMP2_CACHE_DIR": "the user: where dfmp2 keeps what it measured on this machine (the GEMM choices: "
                       "kernels.torch.cpu_gemm), before XDG_CACHE_HOME",
    "XDG_CACHE_HOME": "the user (the XDG base directories): the user's cache directory, else ~/.cache",
    "HOME": "the system: ~ of ~/.cache, the default cache directory",
    "OMP_WAIT_POLICY": _THREADS,
    "OPENBLAS_THREAD_TIMEOUT": _THREADS,
    "OMP_NUM_THREADS": _RECORDED + "; the threads whose stacks and BLAS buffers an rlimit must hold (run.budget)",
    "OPENBLAS_NUM_THREADS": _RECORDED,
    "OPENBLAS_CORETYPE": _RECORDED,
    "OPENBLAS_L2_SIZE": _RECORDED,
    "MKL_NUM_THREADS": _RECORDED,
    "MKL_ENABLE_INSTRUCTIONS": _RECORDED,
    "GLIBC_TUNABLES": _RECORDED,
    # memory
    "SLURM_MEM_PER_NODE": _SLURM + ": --mem, in MiB",
    "SLURM_MEM_PER_CPU": _SLURM + ": --mem-per-cpu, in MiB",
    "SLURM_CPUS_ON_NODE": _SLURM + ": the CPUs --mem-per-cpu is multiplied by",
    "SLURM_MEM_PER_GPU": _SLURM + ": --mem-per-gpu, in MiB",
    "SLURM_GPUS_ON_NODE": _SLURM + ": the GPUs --mem-per-gpu is multiplied by",
    "LOCAL_WORLD_SIZE": "torchrun: the ranks on this node, which share its memory budget (run.memory)",
    # ranks (run.ranks)
    "WORLD_SIZE": "torchrun, or the user under srun: the number of ranks; above 1 the run is distributed",
    "RANK": _RENDEZVOUS + ": this rank's number",
    "LOCAL_RANK": "torchrun, or the user under srun: this rank on its node: its GPU, its NeuronCore (run.ranks)",
    "MASTER_ADDR": _RENDEZVOUS + ": the rendezvous host",
    "MASTER_PORT": _RENDEZVOUS + ": the rendezvous port",
    "NEURON_RT_VISIBLE_CORES": "the launch, else dfmp2 (run.ranks.pin_neuron_core: LOCAL_RANK): a rank's NeuronCores",
    # Neuron SDK and the NKI emulator
    "NEURON_LOGICAL_NC_CONFIG": "the user, else dfmp2 where nki checks it (kernels.nki.backend): the LNC degree "
                                "of kernels and neuronx-cc (kernels.nki.support, the emulator)",
    "NEURON_PLATFORM_TARGET_OVERRIDE": "the user (the Neuron SDK's setting): the NKI emulator's default target",
    "NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE": "the user (neuronx-cc's setting), true: the emulator reserves PSUM bank 7",
}


# the variables whose value dfmp2 reads as a whole number (ASCII digits), with the least value each may take
# and what it counts; `whole_number` reads them, `check_values` checks every one set before a run starts
WHOLE_NUMBERS = {
    "WORLD_SIZE": (1, "processes"), "RANK": (0, "a rank"), "LOCAL_RANK": (0, "a rank on this node"),
    "LOCAL_WORLD_SIZE": (1, "processes on this node"), "MASTER_PORT": (1, "a TCP port"),
    "SLURM_MEM_PER_NODE": (0, "MiB"), "SLURM_MEM_PER_CPU": (0, "MiB"), "SLURM_MEM_PER_GPU": (0, "MiB"),
    "SLURM_CPUS_ON_NODE": (1, "CPUs"), "SLURM_GPUS_ON_NODE": (0, "GPUs"),
}


def _named(name: str) -> str:
    if name not in VARIABLES:
        raise KeyError(f"environment variable {name} is not named in dfmp2.util.environment.VARIABLES")
    return name


def _mapping(environ):
    return os.environ if environ is None else environ


def get(name: str, default=None, environ=None):
    """The value of variable `name` (a str), or `default` where it is not set."""
    return _mapping(environ).get(_named(name), default)


def is_set(name: str, environ=None) -> bool:
    """Whether variable `name` is set (to anything, the empty string included)."""
    return _named(name) in _mapping(environ)


def set_default(name: str, value: str, environ=None) -> bool:
    """Set variable `name` to `value` unless it is set; True where this call set it."""
    mapping = _mapping(environ)
    if _named(name) in mapping:
        return False
    mapping[name] = value
    return True


def whole_number(name: str, default: int | None = None, environ=None) -> int | None:
    """Variable `name` (of WHOLE_NUMBERS) as an int, or `default` where it is not set (or blank).
    InputError, one line naming the variable, for anything but ASCII digits (no sign, no "2.5",
    no Unicode digit such as "\u00b2") or a value below the least it may take: the one place such a
    value is judged, so that it is bad input (exit 2) wherever it is read."""
    least, counts = WHOLE_NUMBERS[_named(name)]
    value = _mapping(environ).get(name)
    if value is None or not value.strip():
        return default
    text = value.strip()
    if not (text.isascii() and text.isdigit()) or int(text) < least:
        raise InputError(f"environment variable {name}={value!r} is not a whole number of {counts}"
                         + (f" from {least}" if least else "") + ": fix the launch's environment, or unset it")
    return int(text)


def check_values(environ=None) -> None:
    """InputError naming the first variable of WHOLE_NUMBERS that is set to something else (a run
    checks them all before anything is computed)."""
    for name in WHOLE_NUMBERS:
        whole_number(name, environ=environ)
