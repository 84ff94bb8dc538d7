"""Double-hybrid density functionals: E = E_KS[hybrid part] + c_os E_os + c_ss E_ss.

Each entry gives the Kohn-Sham part as a PySCF/libxc xc string built from its components
(PySCF's libxc does not know the double hybrids by name) and the MP2 scaling factors, from the
functional's paper; the parameters are those Psi4 tabulates in
psi4/driver/procrouting/dft/dh_functionals.py (the citations below are the papers it names).
Dispersion corrections (-D2, -D3BJ, -NL variants) are not included.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..util.errors import InputError, option


@dataclass(frozen=True)
class DoubleHybrid:
    """A double hybrid: `xc` the KS part (PySCF xc string), c_os and c_ss the MP2 scalings."""

    name: str
    xc: str
    c_os: float
    c_ss: float
    citation: str

    def pt2_energy(self, e_os: float, e_ss: float) -> float:
        """The double hybrid's scaled MP2 part, E_PT2 = c_os E_os + c_ss E_ss (Eh), the one place it is summed."""
        return self.c_os * e_os + (self.c_ss * e_ss if self.c_ss else 0.0)  # (c_ss = 0: E_ss may not be computed)


DOUBLE_HYBRIDS = {dh.name: dh for dh in (
    DoubleHybrid("B2PLYP", "0.53*HF + 0.47*B88, 0.73*LYP", 0.27, 0.27,
                 "S. Grimme, J. Chem. Phys. 124, 034108 (2006)"),
    DoubleHybrid("B2GPPLYP", "0.65*HF + 0.35*B88, 0.64*LYP", 0.36, 0.36,
                 "A. Karton et al., J. Phys. Chem. A 112, 12868 (2008)"),
    DoubleHybrid("DSD-BLYP", "0.75*HF + 0.25*B88, 0.53*LYP", 0.46, 0.60,
                 "S. Kozuch, J. M. L. Martin, J. Comput. Chem. 34, 2327 (2013) (no dispersion)"),
    DoubleHybrid("DSD-PBEP86", "0.72*HF + 0.28*PBE, 0.44*P86", 0.51, 0.36,
                 "S. Kozuch, J. M. L. Martin, J. Comput. Chem. 34, 2327 (2013) (no dispersion)"),
    DoubleHybrid("DSD-PBEPBE", "0.72*HF + 0.28*PBE, 0.48*PBE", 0.54, 0.31,
                 "S. Kozuch, J. M. L. Martin, J. Comput. Chem. 34, 2327 (2013) (no dispersion)"),
    DoubleHybrid("PBE0-DH", "0.5*HF + 0.5*PBE, 0.875*PBE", 0.125, 0.125,
                 "E. Bremond, C. Adamo, J. Chem. Phys. 135, 024106 (2011)"),
    DoubleHybrid("PBE0-2", "0.793701*HF + 0.206299*PBE, 0.5*PBE", 0.5, 0.5,
                 "J.-D. Chai, S.-P. Mao, Chem. Phys. Lett. 538, 121 (2012)"),
)}
ALIASES = {"PBE0DH": "PBE0-DH", "PBE02": "PBE0-2", "DSDPBEP86": "DSD-PBEP86", "DSDPBEPBE": "DSD-PBEPBE"}
NOT_AVAILABLE = {  # named double hybrids whose KS part PySCF's xc strings cannot express
    "PWPB95": "its mPW91 exchange and B95 correlation use re-fitted (tweaked) libxc parameters",
    "PTPSS": "its TPSS exchange and correlation use re-fitted (tweaked) libxc parameters",
}


def double_hybrid(xc: str, c_os: float | None = None, c_ss: float | None = None) -> DoubleHybrid:
    """The double hybrid `xc` names (case-insensitive), or a custom one: any PySCF xc string with
    both c_os and c_ss given. Named ones take no c_os/c_ss (their paper fixes them)."""
    key = ALIASES.get(xc.upper(), xc.upper())
    if key in NOT_AVAILABLE:
        raise InputError(f"{option('xc', xc)}: not available ({NOT_AVAILABLE[key]}); give its KS part as a PySCF "
                         f"xc string with {option('c_os')}/{option('c_ss')} if you have one")
    if key in DOUBLE_HYBRIDS:
        if c_os is not None or c_ss is not None:
            raise InputError(f"{option('xc', xc)} fixes c_os and c_ss ({DOUBLE_HYBRIDS[key].c_os}, "
                             f"{DOUBLE_HYBRIDS[key].c_ss}); {option('c_os')}/{option('c_ss')} go with a custom xc string")
        return DOUBLE_HYBRIDS[key]
    if c_os is None or c_ss is None:
        raise InputError(f"{option('xc', xc)} is not a double hybrid dfmp2 knows ({', '.join(DOUBLE_HYBRIDS)}); "
                         f"for a custom one give its KS part as a PySCF xc string with {option('c_os')} and {option('c_ss')}")
    for name, value in ((option("c_os"), c_os), (option("c_ss"), c_ss)):
        if not math.isfinite(float(value)):
            raise InputError(f"{name} must be a finite number, got {value}")
    return DoubleHybrid("custom", xc, float(c_os), float(c_ss), "user-defined")
