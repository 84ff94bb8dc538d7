"""The one kernel dispatch point: device name -> backend object.

Every device decision in dfmp2 is made here. A backend that was asked for either runs
or raises; nothing falls back to another device. Backends count the kernels they run
(`backend.calls`) so every result can say what actually executed; `backend.record()` is what
a result records about the backend (protocol.BackendRecord).

    cpu, cuda     torch backend (fp64, fp32, or fp32 with split-precision pair GEMMs: tf32x3,
                  bf16x3; on a CPU those are emulated)
    trn1, trn2, trn3  NKI backend on Trainium via torch-neuronx (fp32 only);
                      with simulate=True the same NKI kernels on dfmp2's emulator
"""

from __future__ import annotations

from ..util.errors import DeviceUnavailableError, InputError, option

DEVICES = ("cpu", "cuda", "trn1", "trn2", "trn3")
PRECISIONS = ("fp64", "fp32", "tf32x3", "bf16x3")
# fp32 runs whose (ia|jb) GEMMs are three tensor-core products of high and low parts
# (kernels/torch/split_gemm.py): NVIDIA GPUs, emulated on a CPU
SPLIT_PRECISIONS = ("tf32x3", "bf16x3")
# Trainium's AO->MO transform arithmetic: "exact" (Ozaki slices, exact products and 512-term
# sums; 1 uEh, see ozaki.py) or "fp32" (one plain fp32 product per half; 1e-7 to 1e-3 Eh on real
# molecules, see docs/trainium.md)
TRANSFORMS = ("exact", "fp32")
# The default of the `dfmp2 run`, `grad`, `optimize` and `bench` commands on every device: fp32 GEMMs in the
# pair stage with fp64 sums, measured within 0.1 uEh of fp64 from 24 to 1,156 basis functions
# (docs/benchmarking.md), gradients within 5e-9 Eh/bohr (docs/method.md). Library calls (Settings, the
# PySCF drop-in) keep default_precision.
COMMAND_PRECISION = "fp32"
TRAINIUM = ("trn1", "trn2", "trn3")
# the NKI kernels an MP2 energy from given orbitals launches (no SCF, densities or gradients): the
# whitening, the transform (dense or screened), the pair energies, and the eigen fallback's GEMM
MP2_ENERGY_KERNELS = ("gemm_kernel", "trsm_kernel", "ao2mo_kernel", "pair_energy_kernel")


HOST = "cpu"  # the host CPU's device name (a record's label of arrays made there)


def device_name(device) -> str:
    """The device `device` names, as DEVICES spells it: any case, surrounding blanks ignored (as
    the command line and Settings take it: "CPU", " Cuda "); InputError for a name of none. The
    one check of a device name: get_backend makes it for every entry point (Settings, the PySCF
    drop-in, use_dfmp2_jk, bench)."""
    name = device.strip().lower() if isinstance(device, str) else device
    if name not in DEVICES:
        raise InputError(f"unknown device {device!r} (use one of: {', '.join(DEVICES)})")
    return name


def runs_nki(device: str) -> bool:
    """Whether `device`'s backend runs NKI kernels (trn1, trn2, trn3; with simulate on the emulator)."""
    return device in TRAINIUM


def runs_torch(device: str) -> bool:
    """Whether `device`'s backend computes with torch's own kernels (cpu, cuda: TorchBackend), whose
    thread pool `flush_subnormals_first` flags."""
    return device in ("cpu", "cuda")


def is_host(device: str) -> bool:
    """Whether `device` (a name, e.g. a record's) is the host CPU: its arrays need no upload."""
    return device == HOST


def collective_backend(device: str) -> str:
    """The torch.distributed engine of a team on `device`, known before its backend is loaded: nccl
    for cuda (device memory moves between GPUs); gloo otherwise: CPUs, the NKI emulator and
    NeuronCores, whose blocks are staged through host memory (`run.ranks.Staging`, the backend's
    `on_host`): gloo is the one engine here whose point-to-point sends could be run, and
    torch-xla's process group lacks receives in some releases."""
    return "nccl" if device == "cuda" else "gloo"


def device_screens(device: str) -> frozenset:
    """The steps whose block-sparse three-center kernels the backend of `device` has (its
    `screens`), known before it is loaded: torch (cpu, cuda) the MP2 transform and the SCF
    builds; NKI (trn1, trn2, trn3) the MP2 transform."""
    return frozenset({"mp2"}) if device in TRAINIUM else frozenset({"mp2", "scf"})


def backend_for(settings, kernels=None):
    """The backend a run's Settings ask for: their hardware group (device, precision, simulate,
    model_only, nki_api, transform), as `get_backend` takes it; kernels: as get_backend's."""
    return get_backend(settings.device, settings.precision, settings.simulate, settings.model_only,
                       settings.nki_api, settings.transform, settings.warm_kernels, kernels)


def default_precision(device: str) -> str:
    """fp64 where the device has it; fp32 on Trainium (no fp64 on a NeuronCore)."""
    return "fp32" if device in TRAINIUM else "fp64"


def flush_subnormals_first() -> bool:
    """Flush subnormal fp32 results to zero in this thread and every thread started after it
    (`kernels.torch.backend.flush_subnormals`), before a run starts any: PySCF's OpenMP regions share
    torch's thread pool once torch is loaded (its libgomp comes first in the process's symbol
    scope), so a pool PySCF starts in the SCF's set-up would otherwise keep subnormals. True
    where every thread of torch's pool flushes them."""
    from .torch.backend import subnormals_flushed

    return subnormals_flushed()


def host_fp64_backend():
    """The host CPU's fp64 backend: where a step whose device has no fp64 (a NeuronCore) runs its
    fp64 part (the JK-fit whitening, the gradient's metric factor)."""
    return get_backend("cpu", "fp64")


def get_backend(device: str = "cpu", precision: str | None = None, simulate: bool = False,
                model_only: bool = False, nki_api: str | None = None, transform: str | None = None,
                warm_kernels: bool = False, kernels=None):
    """Backend for `device` in `precision` (None: the device's default).

    InputError for unknown names (`device_name`) and impossible combinations;
    DeviceUnavailableError (a ComputationError) if the device exists in dfmp2 but cannot run on
    this machine (missing GPU or Neuron SDK, or an installed nki release AWS does not support on
    that target). model_only (Trainium with simulate): each
    kernel shape emulated once (the modelled time of runs too large to emulate in full).
    nki_api (Trainium with simulate): the NKI release emulated (default 0.2 trn1, 0.7 trn2 and trn3).
    transform (Trainium): the AO->MO transform's arithmetic, "exact" (default: 7-bit slices, 1 uEh)
    or "fp32" (faster, 1e-7 to 1e-3 Eh off on real molecules); cpu and cuda transform in fp64.
    warm_kernels: kernels with a one-time load (a GPU's fused pair epilogue) whatever the run's
    size (`dfmp2 bench`). kernels (Trainium): the NKI kernels the run may launch (None: any); under
    nki 0.7 a run whose kernels all split over two programs keeps neuronx-cc's LNC degree
    (kernels.nki.support.logical_core_degree), every other run compiles at LNC=1."""
    device = device_name(device)
    precision = precision or default_precision(device)
    if precision not in PRECISIONS:
        raise InputError(f"unknown precision {precision!r} (use one of: {', '.join(PRECISIONS)})")
    if transform is not None and transform not in TRANSFORMS:
        raise InputError(f"unknown transform {transform!r} (use one of: {', '.join(TRANSFORMS)})")
    if device in TRAINIUM:
        return _trainium_backend(device, precision, simulate, model_only, nki_api, transform, kernels)
    if simulate or model_only or nki_api is not None:
        raise InputError(f"{option('simulate')}, {option('model_only')} and {option('nki_api')} apply to "
                         f"{', '.join(TRAINIUM)}, not to {device}")
    if transform is not None:
        raise InputError(f"{option('transform')} applies to {', '.join(TRAINIUM)}; {device} transforms in fp64")
    from .torch.backend import TorchBackend, cuda_available

    if device == "cuda" and not cuda_available():
        raise DeviceUnavailableError(
            f"{option('device', 'cuda')} was requested but no CUDA GPU is usable here "
            "(torch.cuda.is_available() is False); nothing was computed")
    return TorchBackend(device, precision, warm_kernels=warm_kernels)


def _trainium_backend(device, precision, simulate, model_only, nki_api, transform, kernels=None):
    """get_backend's Trainium case (trn1, trn2, trn3): the NKI backend on the Neuron SDK or (simulate) the emulator."""
    if precision != "fp32":  # no fp64 on a NeuronCore; tf32x3/bf16x3 are NVIDIA tensor-core modes
        raise InputError(f"{device} runs fp32 only (it has no fp64 arithmetic, and tf32x3/bf16x3 are for "
                         f"NVIDIA tensor cores): use {option('precision', 'fp32')} (the default there)")
    from nki_emulator import API_VERSIONS, NEWEST_API, TARGETS
    from .nki.support import (NEURON_INSTALL, NEURON_PACKAGES, check_nki_support, installed_nki_api,
                              logical_core_degree, neuron_sdk_missing)

    if model_only and not simulate:
        raise InputError(f"{option('model_only')} needs {option('simulate')}")
    if nki_api is not None and not simulate:
        raise InputError(f"{option('nki_api')} chooses the release the emulator follows (with {option('simulate')}); "
                         "on a Trainium host the installed nki package is used")
    if nki_api is not None and nki_api not in API_VERSIONS:
        raise InputError(f"unknown {option('nki_api')} {nki_api!r} (use one of: {', '.join(API_VERSIONS)})")
    if not simulate:
        missing = neuron_sdk_missing()
        if missing:
            raise DeviceUnavailableError(
                f"{option('device', device)} needs the AWS Neuron SDK ({NEURON_PACKAGES}); missing here: "
                f"{', '.join(missing)}. Install: {NEURON_INSTALL}; or add {option('simulate')} to run the "
                "same NKI kernels on dfmp2's emulator. Nothing was computed.")
    api = (nki_api or NEWEST_API[device]) if simulate else installed_nki_api()
    note = check_nki_support(device, api, installed=not simulate)
    lnc = logical_core_degree(device, api, TARGETS[device].max_lnc, kernels=kernels)
    from .nki.backend import NkiBackend

    return NkiBackend(device, simulate, model_only, nki_api, transform or "exact", lnc=lnc,
                      notes=[note] if note else [])


def device_report() -> dict:
    """Which devices can run on this machine: {device: (usable, detail)}."""
    from nki_emulator import NEWEST_API
    from .nki.support import SUPPORTED_NKI, installed_nki_api, neuron_sdk_missing, release_name
    from .torch.backend import cpu_description, cuda_available, cuda_description

    report = {"cpu": (True, cpu_description())}
    report["cuda"] = (True, cuda_description()) if cuda_available() else (
        False, "no CUDA GPU visible to torch")
    missing = neuron_sdk_missing()
    api = installed_nki_api()
    for trn in TRAINIUM:
        emulated = f"--simulate emulates {release_name(NEWEST_API[trn])} rules by default"
        if missing:
            report[trn] = (False, f"Neuron SDK missing ({', '.join(missing)}); {emulated}")
        elif api in SUPPORTED_NKI[trn]:
            report[trn] = (True, f"Neuron SDK found, {release_name(api)} (supported on {trn}; hardware presence "
                                 "is checked when the device is used)")
        else:
            report[trn] = (False, f"Neuron SDK found, but nki {api} is not supported on {trn} by AWS "
                                  f"(supported: nki {', '.join(SUPPORTED_NKI[trn])}); {emulated}")
    return report
