"""Which NKI release runs on which Trainium target, and whether the Neuron SDK is here.

From AWS's release notes (docs/trainium.md): trn1: SDK 2.28 / nki 0.2 is the last release whose docs
list Trn1; nki 0.3 (SDK 2.29) on trn1 is disputed (AWS: not supported for NKI kernels; one
sibling library ran it); 0.4+ documents Trn2/Trn3 only. trn2: nki 0.2 (SDK 2.28 lists Trn2)
through 0.7 (SDK 2.33). trn3: nki 0.3 (SDK 2.29, the first release whose manifest lists Trn3) through
0.7; SDK 2.28 (nki 0.2) does not list Trn3. Also the run's logical NeuronCore degree
(`logical_core_degree`): nki 0.7 checks that every kernel runs at neuronx-cc's. The table of supported
pairs is the emulator's (rule L19 of docs/nki-audit.md); nothing here imports the SDK itself.
"""

from __future__ import annotations

import importlib.util

from nki_emulator.core import DISPUTED_API, SUPPORTED_API

from ...util import environment
from ...util.errors import option

NEURON_PACKAGES = "torch-neuronx, torch-xla, neuronx-cc and nki"
NEURON_INSTALL = ("pip install 'dfmp2[neuron]' --extra-index-url "
                  "https://pip.repos.neuron.amazonaws.com (on a Trainium instance)")
SUPPORTED_NKI, DISPUTED_NKI = SUPPORTED_API, DISPUTED_API  # one table, the emulator's (rule L19)
# the Neuron SDK a target needs for the releases dfmp2 runs there (said when a pair is refused)
SDK_NEEDED = {"trn1": "trn1 needs Neuron SDK 2.28", "trn2": "trn2 runs Neuron SDK 2.28 to 2.33",
              "trn3": "trn3 needs Neuron SDK 2.29 to 2.33; SDK 2.28 (nki 0.2) does not list Trn3"}
# the Neuron SDK release that ships each nki (AWS's "NKI version to Neuron SDK mapping", SDK 2.33.1)
NEURON_SDK_OF_NKI = {"0.2": "2.28", "0.3": "2.29", "0.4": "2.30", "0.5": "2.31", "0.6": "2.32", "0.7": "2.33"}
LNC_VARIABLE = "NEURON_LOGICAL_NC_CONFIG"  # AWS's setting of the LNC degree, for kernels and neuronx-cc alike
# nki 0.7+: every kernel at neuronx-cc's LNC degree (EVRF066). A run that may launch a kernel with no
# two-program form compiles at LNC=1 (the second core bought 1-3% of the modelled trn2 MP2 time of
# benzene and naphthalene); a run whose kernels all split keeps neuronx-cc's degree (docs/trainium.md)
LNC_FROM_NKI_0_7 = 1
# the kernels that split their work over the programs of a launch grid: kernels.py's (its SPMD
# note) and the rng layer's generator (rng/nki_philox.py, its tiles), named here, not imported
TWO_PROGRAM_KERNELS = frozenset({"gemm_kernel", "syrk_kernel", "trsm_kernel", "ao2mo_kernel", "pair_energy_kernel",
                                 "laplace_z_kernel", "laplace_energy_kernel", "philox_kernel"})


def release_name(api: str | None) -> str:
    """'nki 0.7 (Neuron SDK 2.33)'; 'nki (unknown version)' for None."""
    if api is None:
        return "nki (unknown version)"
    sdk = NEURON_SDK_OF_NKI.get(api)
    return f"nki {api} (Neuron SDK {sdk})" if sdk else f"nki {api}"


def checks_lnc(api: str | None, environ=None) -> bool:
    """True where every kernel of a run must launch at one LNC degree: nki 0.7+ (neuronx-cc checks it,
    EVRF066), and nki 0.6 where NEURON_LOGICAL_NC_CONFIG is set (its nki.jit: the kernel's LNC value must
    match the variable, a mismatch is a runtime error; rule L21 of docs/nki-audit.md)."""
    if api is None:
        return False
    version = tuple(int(x) for x in api.split(".")[:2])
    return version >= (0, 7) or (version == (0, 6) and environment.is_set(LNC_VARIABLE, environ))


def logical_core_degree(target: str, api: str | None, max_lnc: int, environ=None, kernels=None) -> int:
    """The LNC degree a run's kernels are compiled at (physical cores per launch):
    NEURON_LOGICAL_NC_CONFIG if set, else `max_lnc` (2 on trn2 and trn3: neuronx-cc's default); but
    under nki 0.7+ (every kernel at one degree, EVRF066) 1 unless the run's `kernels` (the names it
    may launch; None: any) all have a two-program form (TWO_PROGRAM_KERNELS). Raises InputError for
    a setting the run cannot honour."""
    from ...util.errors import InputError

    given = environment.get(LNC_VARIABLE, environ=environ)
    if given is not None and given.strip() not in ("1", "2"):
        raise InputError(f"{LNC_VARIABLE}={given!r}: the Neuron SDK supports an LNC degree of 1 or 2")
    degree = int(given) if given is not None else None
    if degree is not None and degree > max_lnc:
        raise InputError(f"{LNC_VARIABLE}={degree} on {target}: {target} runs LNC=1 only (unset it)")
    single = sorted(set(kernels) - TWO_PROGRAM_KERNELS) if kernels is not None else None
    if checks_lnc(api, environ) and single != []:
        launches = "kernels" if single is None else ", ".join(single)
        if degree not in (None, LNC_FROM_NKI_0_7):
            why = ("its compiler wants every kernel at one LNC degree (EVRF066)" if api != "0.6" else
                   f"every kernel's LNC value must match {LNC_VARIABLE} (nki.jit: a mismatch is a runtime error)")
            raise InputError(
                f"{LNC_VARIABLE}={degree} with {release_name(api)}: {why} and this run launches {launches} with no "
                f"two-program form, so its "
                f"kernels run at LNC={LNC_FROM_NKI_0_7} (docs/trainium.md); unset {LNC_VARIABLE} or set it to "
                f"{LNC_FROM_NKI_0_7}")
        return LNC_FROM_NKI_0_7
    return degree if degree is not None else max_lnc


def neuron_sdk_missing():
    """Names of the Neuron packages that cannot be imported here (empty if all can)."""
    return [name for name in ("torch_neuronx", "torch_xla", "nki")
            if importlib.util.find_spec(name) is None]


def installed_versions() -> dict:
    """Installed Neuron packages -> version (None where not installed)."""
    from ...util.files import package_versions

    return package_versions(("nki", "neuronx-cc", "torch-neuronx", "torch-xla"))


def installed_nki_api() -> str | None:
    """'0.2' ... of the installed `nki` package (major.minor), or None."""
    version = installed_versions()["nki"]
    return ".".join(version.split(".")[:2]) if version else None


def check_nki_support(target: str, api: str | None, installed: bool) -> str | None:
    """Raise if AWS does not support nki `api` on `target` (DeviceUnavailableError for the
    installed release on a host, InputError for an emulated one chosen with --nki-api); return an
    announcement for a disputed pair (trn1 with nki 0.3), else None."""
    from ...util.errors import DeviceUnavailableError, InputError

    if api in SUPPORTED_NKI[target]:
        return None
    if api in DISPUTED_NKI.get(target, ()):
        return (f"nki {api} on {target}: AWS documents NKI 0.3+ for Trn2/Trn3 only and reports a "
                "trn1 verifier failure; the supported trn1 release is Neuron SDK 2.28 (nki 0.2)")
    supported = ", ".join(SUPPORTED_NKI[target])
    error = DeviceUnavailableError if installed else InputError
    raise error(
        f"{option('device', target)} with the {'installed' if installed else 'emulated'} nki "
        f"{api or '(unknown version)'}: AWS does not support that pair (supported on {target}: nki "
        f"{supported}; {SDK_NEEDED[target]}). Nothing was compiled.")
