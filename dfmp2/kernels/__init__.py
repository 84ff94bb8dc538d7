"""The one kernel dispatch point: device name -> backend object.

Every device decision in dfmp2 is made here. A backend that was asked for either runs
or raises; nothing falls back to another device. Backends count the kernels they run
(`backend.calls`) so every result can say what actually executed.
"""

from __future__ import annotations

from ..errors import ComputationError, InputError

DEVICES = ("cpu", "cuda", "trn1", "trn2")
PRECISIONS = ("fp64", "fp32")


def get_backend(device: str = "cpu", precision: str = "fp64"):
    """Backend for `device` in `precision`. InputError for unknown names or unsupported
    devices; ComputationError if the device exists in dfmp2 but not on this machine."""
    if precision not in PRECISIONS:
        raise InputError(f"unknown precision {precision!r} (use one of: {', '.join(PRECISIONS)})")
    if device not in DEVICES:
        raise InputError(f"unknown device {device!r} (use one of: {', '.join(DEVICES)})")
    if device in ("trn1", "trn2"):
        raise InputError(
            f"device {device!r} is not available yet: the Trainium (NKI) kernel layer has not "
            "landed; use --device cpu or --device cuda")
    from .torch_backend import TorchBackend, cuda_available

    if device == "cuda" and not cuda_available():
        raise ComputationError(
            "--device cuda was requested but no CUDA GPU is usable here "
            "(torch.cuda.is_available() is False); nothing was computed")
    return TorchBackend(device, precision)


def device_report() -> dict:
    """Which devices can run on this machine: {device: (usable, detail)}."""
    from .torch_backend import cpu_description, cuda_available, cuda_description

    report = {"cpu": (True, cpu_description())}
    report["cuda"] = (True, cuda_description()) if cuda_available() else (
        False, "no CUDA GPU visible to torch")
    for trn in ("trn1", "trn2"):
        report[trn] = (False, "Trainium NKI kernel layer not implemented yet")
    return report
