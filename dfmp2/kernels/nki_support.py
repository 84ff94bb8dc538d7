"""Which NKI release runs on which Trainium target, and whether the Neuron SDK is here.

From AWS's release notes (docs/trainium.md): trn1: SDK 2.28 / nki 0.2 is the last release whose docs
list Trn1; nki 0.3 (SDK 2.29) on trn1 is disputed (AWS: not supported for NKI kernels; one
sibling library ran it); 0.4+ documents Trn2/Trn3 only. trn2: nki 0.2 (SDK 2.28 lists Trn2)
through 0.6 (SDK 2.32). trn3: nki 0.3 (SDK 2.29, the first release whose manifest lists Trn3) through
0.6; SDK 2.28 (nki 0.2) does not list Trn3. Only the standard library; nothing here imports the SDK itself.
"""

from __future__ import annotations

import importlib.util

from ..util.errors import option

NEURON_PACKAGES = "torch-neuronx, torch-xla, neuronx-cc and nki"
NEURON_INSTALL = ("pip install 'dfmp2[neuron]' --extra-index-url "
                  "https://pip.repos.neuron.amazonaws.com (on a Trainium instance)")
SUPPORTED_NKI = {"trn1": ("0.2",), "trn2": ("0.2", "0.3", "0.4", "0.5", "0.6"),
                 "trn3": ("0.3", "0.4", "0.5", "0.6")}
DISPUTED_NKI = {"trn1": ("0.3",)}
# releases AWS supports on the target that dfmp2's kernels are not yet valid under (issue 50: nki 0.7's
# LNC check, EVRF066, and its loops)
NOT_YET_NKI = {"trn2": ("0.7",), "trn3": ("0.7",)}
# the Neuron SDK a target needs for the releases dfmp2 runs there (said when a pair is refused)
SDK_NEEDED = {"trn1": "trn1 needs Neuron SDK 2.28", "trn2": "trn2 runs Neuron SDK 2.28 to 2.32",
              "trn3": "trn3 needs Neuron SDK 2.29 to 2.32; SDK 2.28 (nki 0.2) does not list Trn3"}


def neuron_sdk_missing():
    """Names of the Neuron packages that cannot be imported here (empty if all can)."""
    return [name for name in ("torch_neuronx", "torch_xla", "nki")
            if importlib.util.find_spec(name) is None]


def installed_versions() -> dict:
    """Installed Neuron packages -> version (None where not installed)."""
    from ..util.files import package_versions

    return package_versions(("nki", "neuronx-cc", "torch-neuronx", "torch-xla"))


def installed_nki_api() -> str | None:
    """'0.2' ... of the installed `nki` package (major.minor), or None."""
    version = installed_versions()["nki"]
    return ".".join(version.split(".")[:2]) if version else None


def check_nki_support(target: str, api: str | None, installed: bool) -> str | None:
    """Raise if AWS does not support nki `api` on `target` (ComputationError for the installed
    release on a host, InputError for an emulated one chosen with --nki-api); return an
    announcement for a disputed pair (trn1 with nki 0.3), else None."""
    from ..util.errors import ComputationError, InputError

    if api in SUPPORTED_NKI[target]:
        return None
    if api in DISPUTED_NKI.get(target, ()):
        return (f"nki {api} on {target}: AWS documents NKI 0.3+ for Trn2/Trn3 only and reports a "
                "trn1 verifier failure; the supported trn1 release is Neuron SDK 2.28 (nki 0.2)")
    supported = ", ".join(SUPPORTED_NKI[target])
    error = ComputationError if installed else InputError
    if api in NOT_YET_NKI.get(target, ()):
        raise error(f"{option('device', target)} with the {'installed' if installed else 'emulated'} nki {api}: AWS "
                    f"supports it, but dfmp2's kernels are not yet valid under its rules (docs/nki-audit.md, L14); "
                    f"use nki {supported.split(', ')[-1]} (Neuron SDK 2.32). Nothing was compiled.")
    raise error(
        f"{option('device', target)} with the {'installed' if installed else 'emulated'} nki "
        f"{api or '(unknown version)'}: AWS does not support that pair (supported on {target}: nki "
        f"{supported}; {SDK_NEEDED[target]}). Nothing was compiled.")
