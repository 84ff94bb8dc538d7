"""pytest plugin: replace PySCF's DF-MP2 classes by dfmp2's before any test module is imported.

Loaded by tools/pyscf_dropin_tests.py (`python -m pytest -p pyscf_dropin_swap ...` with tools/
on PYTHONPATH). In `pytest_configure`, that is before collection, it assigns dfmp2's classes to
the module and class attributes listed in SWAPS, so that both the tests' own imports
(`from pyscf.mp.dfmp2_native import DFMP2`, `mp.dfump2.DFUMP2(mf)`) and PySCF's internal
look-ups (`mp.MP2(mf).density_fit()` calls `dfmp2.DFMP2(...)` at run time) get dfmp2's.
Nothing else is touched: mean fields, integrals, helper functions stay PySCF's.

All dfmp2 names and all PySCF names are looked up first; if any is missing the run stops with
one error naming every missing one (no partial swap). On success the plugin prints the swapped
names to stderr, once per pytest process. `swap()` can also be called outside pytest.
"""

import importlib
import sys
import types

# What "only the class under test swapped" means. PySCF name -> dfmp2 name.
# "module:Class.attr" is a method hook on a PySCF class (set with lib.class_as_method).
# Aliases of one PySCF class (MP2 = DFMP2 = DFRMP2) are all swapped, so none is left behind.
SWAPS = [
    ("pyscf.mp.dfmp2:DFMP2", "dfmp2.DFMP2"),
    ("pyscf.mp.dfmp2:DFRMP2", "dfmp2.DFMP2"),
    ("pyscf.mp.dfmp2:MP2", "dfmp2.DFMP2"),
    ("pyscf.mp.dfump2:DFUMP2", "dfmp2.DFUMP2"),
    ("pyscf.mp.dfump2:MP2", "dfmp2.DFUMP2"),
    ("pyscf.mp.dfump2:UMP2", "dfmp2.DFUMP2"),
    ("pyscf.mp.dfmp2_slow:DFMP2", "dfmp2.DFMP2"),
    ("pyscf.mp.dfmp2_slow:MP2", "dfmp2.DFMP2"),
    ("pyscf.mp.dfump2_slow:DFUMP2", "dfmp2.DFUMP2"),
    ("pyscf.mp.dfump2_slow:UMP2", "dfmp2.DFUMP2"),
    ("pyscf.mp.dfmp2_native:DFRMP2", "dfmp2.native.DFMP2"),
    ("pyscf.mp.dfmp2_native:DFMP2", "dfmp2.native.DFMP2"),
    ("pyscf.mp.dfmp2_native:RMP2", "dfmp2.native.DFMP2"),
    ("pyscf.mp.dfmp2_native:MP2", "dfmp2.native.DFMP2"),
    ("pyscf.mp.dfmp2_native:SCSDFRMP2", "dfmp2.native.SCSMP2"),
    ("pyscf.mp.dfmp2_native:SCSMP2", "dfmp2.native.SCSMP2"),
    ("pyscf.mp.dfmp2_native:SCSRMP2", "dfmp2.native.SCSMP2"),
    ("pyscf.mp.dfmp2_native:SCSDFMP2", "dfmp2.native.SCSMP2"),
    ("pyscf.mp.dfump2_native:DFUMP2", "dfmp2.native.DFUMP2"),
    ("pyscf.mp.dfump2_native:DFMP2", "dfmp2.native.DFUMP2"),
    ("pyscf.mp.dfump2_native:UMP2", "dfmp2.native.DFUMP2"),
    ("pyscf.mp.dfump2_native:MP2", "dfmp2.native.DFUMP2"),
    ("pyscf.mp.dfump2_native:SCSDFUMP2", "dfmp2.native.SCSUMP2"),
    ("pyscf.mp.dfump2_native:SCSUMP2", "dfmp2.native.SCSUMP2"),
    ("pyscf.mp.dfump2_native:SCSMP2", "dfmp2.native.SCSUMP2"),
    ("pyscf.mp.dfump2_native:SCSDFMP2", "dfmp2.native.SCSUMP2"),
    ("pyscf.mp.dfromp2:DFROMP2", "dfmp2.DFROMP2"),  # module created if PySCF lacks it (< 2.15)
    ("pyscf.scf.hf:RHF.DFMP2", "dfmp2.DFMP2"),
    ("pyscf.scf.uhf:UHF.DFMP2", "dfmp2.DFUMP2"),
    ("pyscf.scf.rohf:ROHF.DFMP2", "dfmp2.DFROMP2"),
    ("pyscf.scf.rohf:ROHF.DFROMP2", "dfmp2.DFROMP2"),
    # mp.MP2(mf) is wrapped: an ROHF mean field with density fitting -> dfmp2.DFROMP2(mf, frozen),
    # anything else -> PySCF's own mp.MP2 (whose RHF/UHF branches reach the swapped classes above).
    ("pyscf.mp:MP2", "dfmp2.DFROMP2 (ROHF + with_df only)"),
]

# PySCF names the swap may create: absent in PySCF 2.14.
CREATED = {"pyscf.mp.dfromp2:DFROMP2", "pyscf.scf.rohf:ROHF.DFROMP2"}

_done = False


class SwapError(RuntimeError):
    pass


def _resolve_dfmp2(name):
    """'dfmp2.native.SCSMP2' -> the object; raises with the reason if it cannot be had."""
    module, _, attr = name.split(" ")[0].rpartition(".")
    return getattr(importlib.import_module(module), attr)


def _pyscf_module(module):
    """Import a PySCF module; for pyscf.mp.dfromp2, absent before PySCF 2.15, an empty stand-in
    (registered in sys.modules and on pyscf.mp only when the swap is made)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if module != "pyscf.mp.dfromp2" or err.name != module:
            raise
        return types.ModuleType(module, "Stand-in made by tools/pyscf_dropin_swap.py.")


def swap():
    """Make every swap in SWAPS, or none (SwapError naming everything missing)."""
    global _done
    if _done:
        return
    from pyscf import lib

    missing, plan = {}, []  # missing: name -> why
    for target, source in SWAPS:
        try:
            new = _resolve_dfmp2(source)
        except Exception as err:  # noqa: BLE001 -- reported below, with its reason
            missing[source.split(" ")[0]] = f"{type(err).__name__}: {err}"
            continue
        module, _, path = target.partition(":")
        owner_name, _, attr = path.rpartition(".")
        try:
            owner = _pyscf_module(module)
            if owner_name:
                owner = getattr(owner, owner_name)
            if target not in CREATED:
                getattr(owner, attr)
        except Exception as err:  # noqa: BLE001
            missing[target.replace(":", ".")] = f"{type(err).__name__}: {err}"
            continue
        if target == "pyscf.mp:MP2":
            new = _rohf_aware_mp2(owner.MP2, new)
        elif owner_name:
            new = lib.class_as_method(new)
        plan.append((owner, attr, new))
    if missing:
        raise SwapError("pyscf_dropin_swap: nothing swapped, missing: " + ", ".join(missing)
                        + "".join(f"\n  {name}: {why}" for name, why in missing.items()))
    for owner, attr, new in plan:
        if isinstance(owner, types.ModuleType) and owner.__name__ not in sys.modules:
            import pyscf.mp  # the dfromp2 stand-in

            sys.modules[owner.__name__] = pyscf.mp.dfromp2 = owner
        setattr(owner, attr, new)
    _done = True
    sys.stderr.write(f"pyscf_dropin_swap: swapped {len(SWAPS)} PySCF names for dfmp2's:\n"
                     + "".join(f"  {t.replace(':', '.')} -> {s}\n" for t, s in SWAPS))


def _rohf_aware_mp2(pyscf_mp2, dfromp2):
    def MP2(mf, frozen=None, mo_coeff=None, mo_occ=None):
        if mf.istype("ROHF") and getattr(mf, "with_df", None):
            if mo_coeff is None and mo_occ is None:
                return dfromp2(mf, frozen)
            return dfromp2(mf, frozen, mo_coeff, mo_occ)
        return pyscf_mp2(mf, frozen, mo_coeff, mo_occ)

    MP2.__doc__ = pyscf_mp2.__doc__
    return MP2


def pytest_configure(config):
    import pytest

    try:
        swap()
    except SwapError as err:
        raise pytest.UsageError(str(err)) from None
