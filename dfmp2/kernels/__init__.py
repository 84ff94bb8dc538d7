"""The one kernel dispatch point: device name -> backend object.

Every device decision in dfmp2 is made here. A backend that was asked for either runs
or raises; nothing falls back to another device. Backends count the kernels they run
(`backend.calls`) so every result can say what actually executed.

    cpu, cuda     torch backend (fp64 or fp32)
    trn1, trn2    NKI backend on Trainium via torch-neuronx (fp32 only);
                  with simulate=True the same NKI kernels on dfmp2's emulator
"""

from __future__ import annotations

from ..errors import ComputationError, InputError

DEVICES = ("cpu", "cuda", "trn1", "trn2")
PRECISIONS = ("fp64", "fp32")
TRAINIUM = ("trn1", "trn2")


def default_precision(device: str) -> str:
    """fp64 where the device has it; fp32 on Trainium (no fp64 on a NeuronCore)."""
    return "fp32" if device in TRAINIUM else "fp64"


def get_backend(device: str = "cpu", precision: str | None = None, simulate: bool = False,
                model_only: bool = False):
    """Backend for `device` in `precision` (None: the device's default).

    InputError for unknown names and impossible combinations; ComputationError if the device
    exists in dfmp2 but cannot run on this machine (missing GPU or Neuron SDK). model_only
    (trn1/trn2 with simulate): emulate each kernel shape once, for a modelled time of runs too
    large to emulate in full.
    """
    if device not in DEVICES:
        raise InputError(f"unknown device {device!r} (use one of: {', '.join(DEVICES)})")
    precision = precision or default_precision(device)
    if precision not in PRECISIONS:
        raise InputError(f"unknown precision {precision!r} (use one of: {', '.join(PRECISIONS)})")
    if device in TRAINIUM:
        if precision != "fp32":
            raise InputError(f"{device} has no fp64 arithmetic: use --precision fp32 (the default there)")
        from .nki_backend import NEURON_INSTALL, NEURON_PACKAGES, NkiBackend, neuron_sdk_missing

        if model_only and not simulate:
            raise InputError("--model-only needs --simulate")
        if not simulate:
            missing = neuron_sdk_missing()
            if missing:
                raise ComputationError(
                    f"--device {device} needs the AWS Neuron SDK ({NEURON_PACKAGES}); missing here: "
                    f"{', '.join(missing)}. Install: {NEURON_INSTALL}; or add --simulate to run the "
                    "same NKI kernels on dfmp2's emulator. Nothing was computed.")
        return NkiBackend(device, simulate, model_only)
    if simulate or model_only:
        raise InputError(f"--simulate and --model-only apply to trn1 and trn2, not to {device}")
    from .torch_backend import TorchBackend, cuda_available

    if device == "cuda" and not cuda_available():
        raise ComputationError(
            "--device cuda was requested but no CUDA GPU is usable here "
            "(torch.cuda.is_available() is False); nothing was computed")
    return TorchBackend(device, precision)


def device_report() -> dict:
    """Which devices can run on this machine: {device: (usable, detail)}."""
    from .nki_backend import neuron_sdk_missing
    from .torch_backend import cpu_description, cuda_available, cuda_description

    report = {"cpu": (True, cpu_description())}
    report["cuda"] = (True, cuda_description()) if cuda_available() else (
        False, "no CUDA GPU visible to torch")
    missing = neuron_sdk_missing()
    for trn in TRAINIUM:
        report[trn] = (False, f"Neuron SDK missing ({', '.join(missing)}); --simulate runs the NKI "
                              "kernels on the emulator") if missing else (
            True, "Neuron SDK found (hardware presence is checked when the device is used)")
    return report
