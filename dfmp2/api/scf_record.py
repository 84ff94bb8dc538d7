"""What a result says of its SCF: what built the SCF's Coulomb and exchange matrices, and whether
the SCF ran in this process or was reused from a checkpoint.

A checkpoint keeps with the SCF's arrays the record of the SCF that made them (`kept_scf_record`,
inside the same vouched-for scf.npz: `checkpoint.policy.RunCheckpoint.resume_scf`). A run that
reuses them reports that record, flagged `scf_reused`, never what its own settings would have
built (`run_scf_record`). The SCF is reused whatever --scf-backend, --scf-precision or screening
this run asks for (they are not part of the SCF's identity: each converges the same orbitals to
the SCF's tolerance, and B and the pair tasks the checkpoint holds are made from those orbitals);
where they differ from what made it, a note says so and how to redo it.
"""

from __future__ import annotations

from ..util.errors import option
from ..util.files import display


def scf_record(builds, mf) -> dict:
    """What built the SCF's Coulomb and exchange matrices, for the result: scf_backend (torch,
    nki or pyscf), scf_precision, scf_iterations (mf's cycles; None where this process ran no
    SCF: under torchrun, where rank 0 runs it and broadcasts its arrays), scf_reused (False:
    `run_scf_record` reports a reused one) and scf_builds (`jk.BuildRecord.as_dict`)."""
    record = {"scf_backend": "pyscf" if builds is None else builds.record.backend,
              "scf_precision": "fp64" if builds is None else builds.record.precision,
              "scf_iterations": None if mf is None else int(getattr(mf, "cycles", 0)), "scf_reused": False}
    if builds is not None and builds.record.builds:
        record["scf_builds"] = builds.record.as_dict()
    return record


def kept_scf_record(builds, mf) -> dict:
    """What a checkpoint keeps beside the SCF `mf` this process has just run with `builds` (None:
    PySCF's J/K): its `scf_record` and the screening of its builds' integrals (None: none)."""
    return {**scf_record(builds, mf), "screening": _screening_of(builds)}


def run_scf_record(builds, mf, held, checkpoint) -> tuple:
    """(the result's SCF fields, the screening record of the SCF's integrals or None, notes).
    builds: this run's SCF builds (None: PySCF's); mf: the SCF this process ran (None: it ran
    none); held: what the checkpoint `checkpoint` (its path) kept with the SCF it gave, where
    this run reused one (`kept_scf_record`), else None."""
    if held is None:
        return scf_record(builds, mf), _screening_of(builds), []
    fields = {**{key: held[key] for key in ("scf_backend", "scf_precision", "scf_iterations")}, "scf_reused": True,
              **({"scf_builds": held["scf_builds"]} if "scf_builds" in held else {})}
    asked = scf_record(builds, None)
    differ = [option(name, value) for name, value, same in (
        ("scf_backend", "pyscf" if asked["scf_backend"] == "pyscf" else "device",
         asked["scf_backend"] == held["scf_backend"]),
        ("scf_precision", asked["scf_precision"],  # (PySCF's J/K are fp64: --scf-backend pyscf says it)
         asked["scf_precision"] == held["scf_precision"] or asked["scf_backend"] == "pyscf")) if not same]
    notes = []
    if differ:
        label = display(checkpoint)
        notes.append(f"the SCF was reused from {option('checkpoint', label)}, made with {_builds(held)}; this run's "
                     f"settings ({', '.join(differ)}) would make it with {_builds(asked)}: remove "
                     f"{label}/scf.npz (or give another {option('checkpoint')}) to redo it (and what is made from it)")
    return fields, held.get("screening"), notes


def _screening_of(builds):
    """The screening record of the builds' JK-fit integrals (None: PySCF's J/K, or none recorded)."""
    return builds.integrals.screening_record if builds is not None else None


def _builds(record) -> str:
    return f"{record['scf_backend']}'s J/K builds ({record['scf_precision']})"
