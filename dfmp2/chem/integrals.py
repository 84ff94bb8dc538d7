"""Integral providers (`dfmp2.run.providers`): (mn|P) and (P|Q) block by block."""

from __future__ import annotations

import math
import threading

import numpy as np

from ..run.context import Timer
from ..util.errors import ComputationError, InputError, option
from .basis import FittingSet, atom_labels, describe_basis, fitting_basis, named_fitting_set


def real_atoms(mol) -> int:
    """The atoms of mol with a nuclear charge (ghost atoms, charge 0, carry only basis functions)."""
    return int(sum(1 for z in mol.atom_charges() if z > 0))


class MNPIntegrals:
    """DF integrals in one auxiliary basis, produced block by block of auxiliary functions: an
    IntegralProvider (`dfmp2.run.providers`).

    nao, naux: sizes. metric(): (P|Q) [naux, naux]. block(p0, p1): (mn|P) as [p1-p0, nao, nao].
    aux_blocks(limit): shell-aligned (p0, p1) ranges of at most `limit` functions where possible.
    fitting: the FittingSet (where each element's set came from). Also a BasisSetIntegrals (the
    SCF's builds, the screening, the derivatives).
    """

    screenable = True  # screened_pattern
    early = False  # EarlyIntegrals: computed on a thread
    screening_record = None  # the --screening choice made for these integrals (set by the driver)

    def __init__(self, mol, auxbasis=None):
        from pyscf import df

        self.mol = mol
        if auxbasis is None:
            self.fitting = fitting_basis(mol, mp2fit=True)
        elif isinstance(auxbasis, str):
            self.fitting = named_fitting_set(auxbasis, mol)
        else:  # a basis as PySCF takes it (e.g. a with_df's auxmol._basis)
            self.fitting = FittingSet(auxbasis, {symbol: describe_basis(auxbasis)
                                                 for symbol in atom_labels(mol).values()})
        self.generated = self.fitting.generated  # elements given PySCF's generated (even-tempered) set
        self.auxbasis = self.basis_name = self.fitting.describe()
        self.auxmol = df.addons.make_auxmol(mol, self.fitting.basis)
        self.nao = mol.nao_nr()
        self.naux = self.auxmol.nao_nr()
        self._aux_loc = self.auxmol.ao_loc_nr()
        self.screening = None  # a sparse.ScreenedPattern: block() gives only its kept pair blocks
        self._tiles = None  # libcint set up for screened blocks (_TileIntegrals), made on first use
        if self.naux == 0:
            raise InputError(f"auxiliary basis {self.auxbasis!r} has no functions for this molecule")

    atoms = property(lambda self: real_atoms(self.mol), doc="real atoms of the molecule (ghosts not counted)")

    def metric(self) -> np.ndarray:
        """Coulomb metric (P|Q), [naux, naux], fp64."""
        return np.asarray(self.auxmol.intor("int2c2e", hermi=1), dtype=np.float64)

    def largest_shell(self) -> int:
        return int(np.max(np.diff(self._aux_loc)))

    def aux_blocks(self, limit: int) -> list:
        """Split [0, naux) at shell boundaries into ranges of at most max(limit, largest shell)."""
        loc = self._aux_loc
        blocks, p0 = [], 0
        for shell in range(len(loc) - 1):
            if loc[shell + 1] - p0 > limit and loc[shell] > p0:
                blocks.append((p0, int(loc[shell])))
                p0 = int(loc[shell])
        blocks.append((p0, int(loc[-1])))
        return blocks

    def block(self, p0: int, p1: int) -> np.ndarray:
        """(mn|P) for P in [p0, p1): [p1-p0, nao, nao], fp64, computed with mn symmetry; with
        self.screening set, only its kept pair blocks (`screened_block`)."""
        from pyscf import lib

        if self.screening is not None:
            return self.screened_block(p0, p1)
        return lib.unpack_tril(self.packed_rows(p0, p1))

    def packed(self) -> np.ndarray:
        """(mn|P) over the pairs m >= n (row-major lower triangle): [naux, npair], fp64."""
        return self.packed_rows(0, self.naux)

    def packed_rows(self, p0: int, p1: int) -> np.ndarray:
        """(mn|P) over the pairs m >= n for P in [p0, p1) (on shell boundaries): [p1 - p0, npair], fp64."""
        from pyscf import df

        shell0, shell1 = self.aux_shells(p0, p1)
        nbas = self.mol.nbas
        packed = df.incore.aux_e2(self.mol, self.auxmol, "int3c2e", aosym="s2ij",
                                  shls_slice=(0, nbas, 0, nbas, shell0, shell1))
        return np.asarray(packed.T, order="C")  # [npair, nP] in Fortran order: no copy

    def fitted_rows(self):
        """What the SCF's builds whiten: packed() [naux, npair], or with self.screening the kept
        pair blocks, each once, over every auxiliary function (`screened_lower`)."""
        return MNPIntegrals.packed(self) if self.screening is None else self.screened_lower(0, self.naux)

    # ---- screening (dfmp2.sparse) ------------------------------------------------------
    def screened_pattern(self, threshold, block_functions):
        """The pair blocks a Schwarz screening at `threshold` keeps (`sparse.ScreenedPattern`):
        q_mn = sqrt(max |(mn|mn)|) per shell pair, s = max_P sqrt((P|P)), blocks of whole atoms."""
        from ..sparse import screen_pair_blocks

        aux_bound = math.sqrt(float(np.max(np.abs(np.diag(self.metric())))))
        atom_shells = [(int(a[0]), int(a[1])) for a in self.mol.aoslice_by_atom()]
        return screen_pair_blocks(pair_bounds(self.mol), aux_bound, self.mol.ao_loc_nr(), atom_shells, threshold,
                                  block_functions)

    def screened_block(self, p0: int, p1: int):
        """(mn|P) for P in [p0, p1) on the kept pair blocks of self.screening only, both
        orientations (a `sparse.ScreenedMNP`, host fp64)."""
        return self.screened_lower(p0, p1).expand()

    def screened_lower(self, p0: int, p1: int):
        """(mn|P) for P in [p0, p1) on the kept pair blocks (M, N), N <= M, of self.screening
        (a `sparse.LowerPanels`, host fp64): each computed once by libcint."""
        from ..sparse import LowerPanels

        shell0, shell1 = self.aux_shells(p0, p1)
        if self._tiles is None:  # libcint's set-up once (~20 ms for a 500-function molecule)
            self._tiles = _TileIntegrals(self.mol, self.auxmol)
        tiles, blocks = self._tiles, self.screening.blocks
        return LowerPanels.from_runs(self.screening, p1 - p0, lambda m, n0, n1: tiles.tile(
            blocks[m][2:], (blocks[n0][2], blocks[n1 - 1][3]), shell0, shell1))

    def aux_shells(self, p0, p1) -> tuple:
        """The auxiliary shells [first, past the last) of the functions [p0, p1) (shell boundaries)."""
        shell0 = int(np.searchsorted(self._aux_loc, p0))
        shell1 = int(np.searchsorted(self._aux_loc, p1))
        if self._aux_loc[shell0] != p0 or self._aux_loc[shell1] != p1:
            raise ValueError(f"aux range [{p0}, {p1}) does not fall on shell boundaries")
        return shell0, shell1


class _TileIntegrals:
    """(mn|P) of the shells rows [a0, a1) x cols [b0, b1) and auxiliary shells, libcint set up
    once: tile() -> [nP, nM, nN], fp64 (C order, no copy of libcint's output)."""

    def __init__(self, mol, auxmol):
        from pyscf import gto

        self.nbas = mol.nbas
        self.intor = mol._add_suffix("int3c2e")
        self.env = gto.mole.conc_env(mol._atm, mol._bas, mol._env, auxmol._atm, auxmol._bas, auxmol._env)
        self.cintopt = gto.moleintor.make_cintopt(*self.env, self.intor)

    def tile(self, rows, cols, aux0, aux1) -> np.ndarray:
        from pyscf import gto

        shls = (cols[0], cols[1], rows[0], rows[1], self.nbas + aux0, self.nbas + aux1)
        out = gto.moleintor.getints(self.intor, *self.env, shls, None, 0, "s1", None, self.cintopt)
        return out.T  # [nN, nM, nP] in Fortran order: [nP, nM, nN]


def pair_bounds(mol) -> np.ndarray:
    """sqrt(max |(mn|mn)|) of every shell pair [nbas, nbas] (PySCF's Schwarz conditions, libcvhf)."""
    try:
        from pyscf.scf import _vhf

        return np.asarray(_vhf._VHFOpt(mol, "int2e", qcondname="CVHFnr_int2e_q_cond").q_cond, dtype=np.float64)
    except (ImportError, AttributeError) as error:  # a PySCF without the optimizer dfmp2 was written against
        raise ComputationError(f"PySCF's Schwarz bounds (pyscf.scf._vhf._VHFOpt) are not available: {error}; "
                               f"use {option('screening', 'off')}") from error


class EarlyIntegrals(MNPIntegrals):
    """MNPIntegrals whose fitted_rows() (packed (mn|P), or the screened pair blocks) are
    computed on a thread from start() on: libcint runs without the GIL, so the caller's own work
    meanwhile (importing torch for the backend, ~1 s; PySCF's one-electron integrals and initial
    guess) overlaps them. fitted_rows() waits for them and hands them over once (the SCF whitens
    them in place); a failure on the thread is raised there. seconds: the thread's wall time;
    waited: fitted_rows()'s wait."""

    early = True

    def __init__(self, mol, auxbasis=None):
        super().__init__(mol, auxbasis)
        self._packed = self._error = self._thread = None
        self.seconds = self.waited = 0.0

    def start(self):
        """Start computing them on a thread; returns self."""
        self._thread = threading.Thread(target=self._compute, name="dfmp2-jk-integrals", daemon=True)
        self._thread.start()
        return self

    def _compute(self):
        with Timer().lap() as lap:
            try:
                self._packed = MNPIntegrals.fitted_rows(self)
            except BaseException as error:  # handed to packed(), which raises it in the caller
                self._error = error
        self.seconds = lap.seconds

    def held_bytes(self) -> int:
        """Bytes of the computed integrals this provider holds (waits for them; 0 once handed over): the
        SCF's arrays, which the budget's check before the SCF takes off the footprint (checks.check_budget)."""
        self._wait()
        return 0 if self._packed is None else self._packed.nbytes

    def _wait(self):
        if self._thread is None:
            return
        with Timer().lap() as lap:
            self._thread.join()
        self.waited += lap.seconds
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def fitted_rows(self):
        """MNPIntegrals.fitted_rows, the thread's (computed anew if asked again, or if
        never started; self.screening must not change after start())."""
        self._wait()
        rows, self._packed = self._packed, None
        return rows if rows is not None else MNPIntegrals.fitted_rows(self)

    def packed(self) -> np.ndarray:
        """(mn|P) over the pairs m >= n: [naux, npair], fp64 (the thread's, as fitted_rows)."""
        if self.screening is not None:
            raise ValueError("screened integrals have no packed triangle: use fitted_rows()")
        return self.fitted_rows()


class CholeskyVectors:
    """The three-center integrals a PySCF density-fitting object already holds, whitened:
    L_mn^P with (mn|ls) ~ sum_P L_mn^P L_ls^P, from a molecular pyscf.df.DF's `_cderi` (a
    density-fitted SCF's, reused as PySCF's DFMP2 reuses them) or a periodic GDF's gamma-point
    integrals (built if need be). An IntegralProvider (`dfmp2.run.providers`) with the identity as metric,
    so that steps 1 and 3 of the pipeline leave them as they are. Periodic: only the positive-
    definite case (3-D, or infinite-vacuum 2-D); a negative part (truncated Coulomb of 2-D
    cells) is refused."""

    screenable = False  # never screened (no screened_pattern)
    screening = None
    screening_record = None  # the --screening choice made for these integrals (set by the driver)

    def __init__(self, with_df):
        self.with_df = with_df
        self.mol = getattr(with_df, "cell", None) or with_df.mol
        self.periodic = hasattr(with_df, "cell")
        if self.periodic:
            from pyscf.pbc import df as pbc_df

            if not isinstance(with_df, pbc_df.GDF):
                raise InputError(f"periodic mean fields are supported with Gaussian density fitting (GDF, "
                                 f"mf.density_fit()), not {type(with_df).__name__}")
            if self.mol.dimension == 2 and self.mol.low_dim_ft_type != "inf_vacuum":
                raise InputError("2-D cells with a truncated Coulomb operator have a negative-definite part in "
                                 "their density fitting, which dfmp2 does not handle")
        self.nao = self.mol.nao_nr()
        try:
            self.naux = int(with_df.get_naoaux())  # builds the integrals if they are not there yet
        except OSError as error:  # a _cderi file that is not there or not HDF5
            raise InputError(f"with_df's integrals {with_df._cderi!r} cannot be read: {error}") from None
        auxmol = getattr(with_df, "auxmol", None)
        named = with_df.auxbasis if with_df.auxbasis is not None else getattr(auxmol, "basis", None)
        self.basis_name = describe_basis(named) if named is not None else "an unnamed set"
        self.auxbasis = f"{self.basis_name} ({'GDF integrals at the gamma point' if self.periodic else 'the integrals with_df holds'})"
        self.fitting = FittingSet(named, {symbol: self.auxbasis for symbol in atom_labels(self.mol).values()})
        self.generated = []

    atoms = property(lambda self: real_atoms(self.mol), doc="real atoms of the molecule (or cell)")

    def metric(self) -> np.ndarray:
        """The identity [naux, naux]: the vectors are already whitened."""
        return np.eye(self.naux)

    def largest_shell(self) -> int:
        return 1

    def aux_blocks(self, limit: int) -> list:
        step = max(1, limit)
        return [(p0, min(p0 + step, self.naux)) for p0 in range(0, self.naux, step)]

    def block(self, p0: int, p1: int) -> np.ndarray:
        """L_mn^P for P in [p0, p1): [p1-p0, nao, nao], fp64 (gamma point: real)."""
        if self.periodic:
            packed = np.concatenate([real for real, _, sign in self.with_df.sr_loop(
                np.zeros((2, 3)), compact=False, blksize=p1 - p0, aux_slice=(p0, p1)) if sign == 1])
        else:
            import h5py
            from pyscf.df import addons
            from pyscf.df import df as molecular_df

            with addons.load(self.with_df._cderi, self.with_df._dataname) as stored:
                packed = molecular_df._load_from_h5g(stored, p0, p1) if isinstance(stored, h5py.Group) \
                    else np.asarray(stored[p0:p1])
        if packed.shape[1] == self.nao * self.nao:
            return np.ascontiguousarray(packed.reshape(-1, self.nao, self.nao), dtype=np.float64)
        from pyscf import lib

        return lib.unpack_tril(np.asarray(packed, dtype=np.float64))
