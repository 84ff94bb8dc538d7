"""What the ranks of a team agree on before any work: the digest of a run, made by the driver from
what it has checked, and compared by `dfmp2.run.ranks.Team.agree_on` (the run's first collective).

    digest = run_digest(mol, settings, integrals, backend, jk_fitting)
    team.agree_on(digest)  # InputError on every rank naming what differs

A digest is {part: {aspect: value}}: the molecule (atoms, geometry, ghosts, charge, spin; the CLI adds
the file's fragments), the basis sets (the orbital basis's shells and ECPs as PySCF holds them, the
MP2 and JK fitting sets), the sizes the collectives carry, the settings (AGREED_SETTINGS), the
backend (device, kernels, precision, transform; the team adds its collective backend) and the code
(dfmp2's version and source, PySCF's, torch's and numpy's versions).
Each Settings field is in AGREED_SETTINGS or in PER_RANK_SETTINGS, which says why a rank may have
its own (tests/test_team_agreement.py checks that every field is in one).
"""

from __future__ import annotations

import functools
import hashlib
import pathlib
from importlib import metadata

import numpy as np

from .. import chem
from ..run.settings import Settings
from ..util.version import __version__

# Settings fields every rank must share: each changes what is computed (the molecule, the SCF, the
# correlation, what the result holds) or the shapes and dtypes the collectives carry.
AGREED_SETTINGS = (
    # the molecule and its SCF: basis, ECPs, fitting sets, charge, spin, reference, SCF mode and
    # builds. scf_max_cycle too: only rank 0 runs the SCF, but one run has one limit (rank 0's
    # would quietly overrule another rank's)
    "basis", "ecp", "auxbasis", "jk_auxbasis", "cartesian", "charge", "spin", "reference", "scf",
    "scf_max_cycle", "scf_backend", "scf_precision", "screening", "frozen_core", "xc", "c_os", "c_ss",
    # the correlation step: the active orbitals (the shapes of every block), what the result holds
    "frozen", "allow_non_aufbau", "with_rdm1", "gradient", "properties", "with_gamma", "rdm1_scaling",
    "with_t2", "include_singles",
    # the method and its Laplace quadrature: what E_os is and the points every rank's Z(t) sums over
    "method", "laplace",
    # the hardware: the backend's kernels and their dtypes (fp32 against fp64 blocks: gloo's abort)
    "device", "precision", "simulate", "model_only", "nki_api", "transform", "warm_kernels",
    # B on disk whatever the budget: the storage of every rank's blocks (the plan's)
    "force_outcore",
    # whether the checkpoint may share its directory with other files: rank 0 decides over the
    # checkpoint for all, so another rank's choice would be quietly overruled
    "checkpoint_allow_other_files",
)

# Settings fields a rank may have of its own, and why (each is still checked where it is used)
PER_RANK_SETTINGS = {
    "max_memory": "each process's budget, its node's: every rank plans from its own and the team "
                  "takes the tightest plan (run.ranks.Team.tightest_plan)",
    "scratch": "a directory on the rank's own node (node-local disks); each rank's files are its own",
    "checkpoint": "a path, which the ranks' mounts may spell differently for one shared directory "
                  "(rank 0 checks that every rank sees the same one); whether a checkpoint is given "
                  "is agreed (the aspect `checkpoint`)",
}
# Not in the digest either, being no Settings: the CLI's --json, --natorbs paths, --quiet, --debug and
# --rank-timeout (rank 0 alone writes and prints; each rank waits as long as it is told); the
# device's description (nodes of one model may report it differently).


def run_digest(mol, settings: Settings, integrals, backend, jk_fitting=None, extra=None) -> dict:
    """The digest of a run of `mol` (the PySCF Mole the driver built and checked) with `settings`
    (frozen_core resolved), MP2 fitting integrals `integrals` (chem.MNPIntegrals or
    another provider; None: the set settings.auxbasis names for the basis, both agreed), the
    `backend` (dfmp2.kernels) and the SCF's JK-fit set `jk_fitting` (chem.FittingSet; None: exact
    SCF, or a mean field given). extra: {part: {aspect: value}} the caller adds (the CLI: fragments)."""
    digest = {"molecule": molecule_aspects(mol),
              "basis sets": {"orbital basis": _plain(mol._basis), "ECPs": _plain(mol._ecp),
                             "Cartesian functions": bool(mol.cart),
                             "MP2 fitting set": _fitting_of(integrals),
                             "JK fitting set": None if jk_fitting is None else
                             _plain([jk_fitting.basis, jk_fitting.sources])},
              "sizes": {"basis functions": int(mol.nao_nr()),
                        "fitting functions": None if integrals is None else int(integrals.naux)},
              "settings": settings_aspects(settings),
              "backend": {"device": backend.device_name, "kernels": backend.name, "precision": backend.precision,
                          "transform": backend.transform},
              "code": code_aspects()}
    for part, aspects in (extra or {}).items():
        digest[part] = {**digest.get(part, {}), **{aspect: _plain(value) for aspect, value in aspects.items()}}
    return digest


def mean_field_digest(mf, settings: Settings, integrals, backend) -> dict:
    """The digest of a DF-MP2 run on the PySCF mean field `mf` (`run_digest` of its molecule, with
    the mean field's kind: its orbitals, rank 0's, replace this rank's, which must be of that kind)."""
    digest = run_digest(mf.mol, settings, integrals, backend)
    digest["mean field"] = {"reference": chem.reference_kind(mf), "functional": _plain(getattr(mf, "xc", None)),
                            "SCF": chem.scf_mode(mf)}
    digest["sizes"]["orbitals"] = _plain(np.shape(mf.mo_coeff))
    return digest


def molecule_aspects(mol) -> dict:
    """Atoms (elements in order), geometry (Bohr, exact), ghosts (their indices), charge and 2S of `mol`."""
    labels = [mol.atom_symbol(i).upper() for i in range(mol.natm)]
    ghosts = [i for i, label in enumerate(labels) if label.startswith(("GHOST", "X-"))]
    return {"atoms": [mol.atom_pure_symbol(i).upper().removeprefix("GHOST-").removeprefix("X-")
                      for i in range(mol.natm)],
            "geometry": [float(x) for x in np.asarray(mol.atom_coords(), dtype=np.float64).ravel()],
            "ghosts": ghosts, "charge": int(mol.charge), "spin": int(mol.spin)}


def settings_aspects(settings: Settings) -> dict:
    """The AGREED_SETTINGS of `settings`, and whether a checkpoint is given (its path is per rank).
    frozen as the caller gave it: with frozen_core (which excludes frozen) the driver sets it to the
    core's orbital count, derived from the molecule (agreed), so it is None here."""
    aspects = {name: _plain(getattr(settings, name)) for name in AGREED_SETTINGS}
    aspects["frozen"] = None if settings.frozen_core else aspects["frozen"]
    aspects["checkpoint"] = settings.checkpoint is not None
    return aspects


@functools.lru_cache(maxsize=1)
def code_aspects() -> dict:
    """dfmp2's version and a fingerprint of its source (two checkouts of one version differ), and the
    versions of the libraries that compute with it."""
    package = pathlib.Path(__file__).resolve().parent.parent
    source = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        source.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes() + b"\0")
    return {"dfmp2 version": __version__, "dfmp2 source": source.hexdigest(),
            **{f"{name} version": _version(name) for name in ("pyscf", "torch", "numpy")}}


def _fitting_of(integrals):
    """The MP2 fitting set of `integrals` (an IntegralProvider): its FittingSet's basis (a name, or
    per element) and sources (PySCF's version agreed: one name is one set), else its description."""
    if integrals is None:
        return None
    if integrals.fitting is None:
        return _plain(integrals.auxbasis)
    return _plain([integrals.fitting.basis, integrals.fitting.sources])


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def _plain(value):
    """`value` with numpy arrays and scalars as lists and numbers, tuples as lists and dict keys
    sorted: one repr for one value however a rank built it."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {str(key): _plain(value[key]) for key in sorted(value, key=str)}
    if isinstance(value, (list, tuple, range)):
        return [_plain(item) for item in value]
    return value


def agree_on_run(context, mol, settings: Settings, integrals, backend, jk_fitting=None) -> None:
    """Where `context` (run.context.RunContext) has a team: its ranks agree on the run before any
    work (`run_digest`, with the parts the caller added: context.agreed); nothing in one process."""
    if context.team is not None:
        context.team.agree_on(run_digest(mol, settings, integrals, backend, jk_fitting, context.agreed))


def agreed_mean_field(context, mf, settings: Settings, integrals, backend):
    """`mf` in one process; over ranks, once they agree on the run (`mean_field_digest`), a copy of
    it holding rank 0's orbitals (every rank uses them)."""
    if context.team is None:
        return mf
    context.team.agree_on(mean_field_digest(mf, settings, integrals, backend))
    return chem.restored_scf_from(mf, context.team.broadcast_object(chem.scf_arrays(mf)))


def frame_parts(frame) -> dict:
    """The parts the CLI adds to its run's digest from the file's frame (chem.Frame): its
    fragments (atoms, charge, multiplicity; not the lines that give them)."""
    return {"molecule": {"fragments": [(f.start, f.stop, f.charge, f.multiplicity) for f in frame.fragments]}}
