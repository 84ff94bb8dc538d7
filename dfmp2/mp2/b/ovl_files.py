"""B in PySCF's ovL files: HDF5 datasets 'ovL' (restricted) or 'ovL0', 'ovL1', with what dfmp2
made them from (`write_ovl`, `open_ovl`; the drop-in's `ovL_to_save` and `ovL`)."""

from __future__ import annotations

import os

import numpy as np

from ...util.errors import InputError
from ...util.files import display, write_output
from ...util.provenance import h5_identity, stamp_h5


def ovl_names(nspin: int) -> list:
    """The HDF5 dataset names of B in PySCF's ovL files: 'ovL' (restricted), 'ovL0', 'ovL1'."""
    return ["ovL"] if nspin == 1 else [f"ovL{s}" for s in range(nspin)]


def write_ovl(path, fill, identity, orbitals, inputs=(), directories=()) -> None:
    """Write B per spin channel to the HDF5 file `path` in PySCF's layout (`ovl_names`), by the
    rules of every output (`files.write_output`: a regular file, whole or not at all), with what
    it was made from: its identity (`provenance.stamp_h5`) and the active orbitals [(C_occ,
    C_vir) per spin] (datasets dfmp2_orbitals/occ<s>, vir<s>). fill(out) makes B, calling
    out(s, shape) for channel s's dataset [nocc * nvir, naux] and writing into it; it returns
    the list of what out gave (its length is the number of channels)."""
    import h5py

    def write_file(tmp):
        with h5py.File(tmp, "w") as h5:
            made = []

            def out(s, shape):
                made.append(h5.create_dataset(f"ovL{s}", shape=shape, dtype=np.float64))
                return made[-1]

            if len(fill(out)) == 1:  # a restricted reference's single dataset is 'ovL'
                h5.move("ovL0", "ovL")
            stamp_h5(h5, identity)
            for s, (occ, vir) in enumerate(orbitals):
                h5.create_dataset(f"dfmp2_orbitals/occ{s}", data=np.asarray(occ, dtype=np.float64))
                h5.create_dataset(f"dfmp2_orbitals/vir{s}", data=np.asarray(vir, dtype=np.float64))

    write_output("ovL_to_save", path, write_file, inputs, directories, regular_only=True)


def open_ovl(path) -> tuple:
    """(ovL, open file, identity, orbitals) of an HDF5 file of B in PySCF's layout: ovL is the
    'ovL' dataset, or the list of 'ovL0' and 'ovL1'; identity and orbitals [(C_occ, C_vir) per
    spin] what dfmp2 recorded of what it was made from (None, None in a file dfmp2 did not
    write). InputError if the file holds neither layout."""
    import h5py

    try:
        handle = h5py.File(os.fspath(path), "r")
    except (OSError, ValueError) as error:
        raise InputError(f"ovL {display(path)}: not a readable HDF5 file ({error})") from None
    identity, orbitals = h5_identity(handle), None
    if identity is not None and "dfmp2_orbitals" in handle:
        group = handle["dfmp2_orbitals"]
        orbitals = [(group[f"occ{s}"][...], group[f"vir{s}"][...]) for s in range(len(group) // 2)]
    if "ovL" in handle:
        return handle["ovL"], handle, identity, orbitals
    if "ovL0" in handle and "ovL1" in handle:
        return [handle["ovL0"], handle["ovL1"]], handle, identity, orbitals
    handle.close()
    raise InputError(f"ovL {display(path)}: no 'ovL' (or 'ovL0' and 'ovL1') dataset: not an (ia|P) file of PySCF "
                     "or dfmp2")
