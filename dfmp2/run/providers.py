"""The provider protocols of the pipeline: where the integrals come from, and where B lives.

The pipeline (`dfmp2.mp2.pipeline`) composes the steps (`dfmp2.mp2.steps`) with one provider of each
kind; it never asks which one it holds.

IntegralProvider: the three-center integrals (mn|P) and the metric (P|Q) of one auxiliary basis.
    chem.MNPIntegrals            PySCF's integrals of a molecule (the default)
    chem.CholeskyVectors         Cholesky vectors a PySCF DF object holds (identity metric)
    rng.synthetic.SyntheticIntegrals   a seeded synthetic problem (`dfmp2 bench`)
BasisSetIntegrals: an IntegralProvider of a molecule's basis sets, with what the SCF's builds, the
screening and the derivatives use: chem.MNPIntegrals (chem.EarlyIntegrals: on a thread).

B's provider protocols (`BProvider`, `DensitySchedule`) are in `dfmp2.mp2.b.protocol`.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class IntegralProvider(Protocol):
    """(mn|P) in auxiliary blocks and (P|Q), fp64 host arrays."""

    nao: int  # orbital basis functions
    naux: int  # auxiliary functions
    auxbasis: str  # the auxiliary basis, described for the result
    fitting: object  # where each element's auxiliary set came from (a chem.FittingSet; None: synthetic)
    screenable: bool  # has screened_pattern (BasisSetIntegrals); Cholesky vectors and synthetic integrals are not screened
    screening: object  # a sparse.ScreenedPattern: block() gives only its kept pair blocks; None: every block in full
    screening_record: dict | None  # the --screening choice made for it (sparse.screen_integrals; the driver keeps it here)
    atoms: int | None  # real atoms (ghosts have no electrons) of the molecule; None where none is named (synthetic)

    def metric(self) -> np.ndarray:
        """(P|Q) [naux, naux]."""

    def aux_blocks(self, limit: int) -> list:
        """[(p0, p1)] covering range(naux), each at most `limit` wide (or one shell, if wider)."""

    def block(self, p0: int, p1: int) -> np.ndarray:
        """(mn|P) for P in [p0, p1): [p1 - p0, nao, nao]."""

    def largest_shell(self) -> int:
        """Functions of the widest auxiliary shell (the smallest block there can be)."""


class BasisSetIntegrals(IntegralProvider, Protocol):
    """The integrals of a molecule's basis sets (chem.MNPIntegrals; chem.EarlyIntegrals, which
    computes fitted_rows() on a thread): what the SCF's builds (`chem.jk`), the screening
    (`sparse.screen_integrals`) and the derivatives (`chem.derivatives`) use beyond IntegralProvider.
    chem.CholeskyVectors has mol and basis_name of them."""

    mol: object  # the PySCF molecule (orbital basis)
    auxmol: object  # the auxiliary basis as a PySCF molecule
    basis_name: str  # the auxiliary set described (auxbasis)
    early: bool  # fitted_rows() computed on a thread from start() on (EarlyIntegrals)
    seconds: float  # early: the thread's wall time
    waited: float  # early: fitted_rows()'s wait for the thread

    def held_bytes(self) -> int:
        """Early: bytes of the thread's integrals held (waits for them; 0 once handed over)."""

    def start(self):
        """Early: start computing fitted_rows() on a thread; returns self."""

    def packed_rows(self, p0: int, p1: int) -> np.ndarray:
        """(mn|P) over the pairs m >= n for P in [p0, p1) (on shell boundaries): [p1 - p0, npair]."""

    def fitted_rows(self):
        """What the SCF's builds whiten: (mn|P) over the pairs m >= n [naux, npair], or with screening
        its kept pair blocks, each once (a sparse.LowerPanels)."""

    def screened_pattern(self, threshold, block_functions):
        """The pair blocks a Schwarz screening at `threshold` keeps (a sparse.ScreenedPattern)."""

    def screened_lower(self, p0: int, p1: int):
        """(mn|P) for P in [p0, p1) on screening's kept pair blocks (M, N), N <= M (a sparse.LowerPanels)."""

    def aux_shells(self, p0: int, p1: int) -> tuple:
        """The auxiliary shells (first, past the last) of the functions [p0, p1) (shell boundaries)."""
