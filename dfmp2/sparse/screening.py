"""Which AO-pair blocks of (mn|P) are kept: Schwarz screening of contiguous atom blocks.

    estimate      max_P |(mn|P)| <= q_mn s,  q_mn = sqrt(max |(mn|mn)|) over the shell pair,
                  s = max_P sqrt((P|P)) over the auxiliary basis
    kept          (M, N), N <= M, when max over the shell pairs of M x N of q_mn s > threshold
                  (diagonal blocks always)

The setting (`--screening`): "off", "auto" (screen where it pays, at SCREENING_DEFAULT), or a
threshold (always screen at it). `choose_screening` makes the decision and its record.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..util.errors import InputError, option
from ..util.log import log

SCREENING_DEFAULT = 1e-10  # Eh-scale bound on a dropped |(mn|P)|; measured: docs/sparse.md
LOOSEST_THRESHOLD = 1e-6  # a looser threshold is refused (energies would move by far more than 1e-8 Eh)
AUTO_MAX_STORED = 0.5  # auto: screen when the panels hold at most this fraction of the dense nao^2 elements
BLOCK_FUNCTIONS = 32  # AOs per row block on cpu/cuda (a GEMM's inner size; measured: docs/sparse.md)


def parse_screening(value) -> tuple:
    """("off" | "auto" | "threshold", threshold or None) of a --screening value: off, auto, or a
    number in (0, LOOSEST_THRESHOLD]; anything else is an InputError."""
    text = str(value).strip().lower()
    if text in ("off", "auto"):
        return text, (None if text == "off" else SCREENING_DEFAULT)
    try:
        threshold = float(text)
    except ValueError:
        raise InputError(f"{option('screening', value)}: use off, auto, or a threshold such as 1e-10") from None
    if not 0.0 < threshold <= LOOSEST_THRESHOLD:
        raise InputError(f"{option('screening', value)}: a threshold must be in (0, {LOOSEST_THRESHOLD:g}] (looser ones "
                         "move energies by far more than 1e-8 Eh)")
    return "threshold", threshold


@dataclass(frozen=True)
class ScreenedPattern:
    """The kept AO-pair blocks of one molecule against one auxiliary basis.

    blocks: ((ao0, ao1, shell0, shell1), ...) contiguous atom blocks; pairs: kept (M, N), N <= M;
    rows[M]: the kept N of row M in both orientations, ascending (what panel M holds)."""

    threshold: float
    nao: int
    blocks: tuple
    pairs: tuple
    rows: tuple = field(init=False)
    offsets: tuple = field(init=False, compare=False)  # offsets[M]: {N: the first column of block N in panel M}

    def __post_init__(self):
        rows = [[] for _ in self.blocks]
        for m, n in self.pairs:
            rows[m].append(n)
            if n != m:
                rows[n].append(m)
        object.__setattr__(self, "rows", tuple(tuple(sorted(r)) for r in rows))
        offsets = []
        for row in self.rows:
            starts = np.cumsum([0] + [self.width(n) for n in row])
            offsets.append({n: int(start) for n, start in zip(row, starts)})
        object.__setattr__(self, "offsets", tuple(offsets))

    def width(self, m) -> int:
        return self.blocks[m][1] - self.blocks[m][0]

    def columns(self, m, lower=False) -> np.ndarray:
        """AO indices of the columns of panel m (its kept blocks' AOs, ascending; lower: of the
        blocks N <= m only, the LowerPanels' columns) [ncols_m]."""
        return np.concatenate([np.arange(self.blocks[n][0], self.blocks[n][1]) for n in self.rows[m]
                               if not lower or n <= m])

    def runs(self, m, lower=False) -> list:
        """[(N0, N1)]: the kept column blocks of row m (lower: those N <= m) as contiguous runs."""
        runs = []
        for n in self.rows[m]:
            if lower and n > m:
                break
            if runs and runs[-1][1] == n:
                runs[-1] = (runs[-1][0], n + 1)
            else:
                runs.append((n, n + 1))
        return runs

    def column_offsets(self, m) -> dict:
        """N -> the first column of block N in panel m (made once, with the pattern)."""
        return self.offsets[m]

    @property
    def stored_elements(self) -> int:
        """(m, n) elements the panels hold per auxiliary function (both orientations)."""
        return sum(self.width(m) * sum(self.width(n) for n in row) for m, row in enumerate(self.rows))

    def lower_width(self, m) -> int:
        """Columns of LowerPanels' panel m: the functions of its kept blocks N <= m."""
        return sum(self.width(n) for n in self.rows[m] if n <= m)

    @property
    def lower_elements(self) -> int:
        """(m, n) elements LowerPanels hold per auxiliary function (each kept block pair once)."""
        return sum(self.width(m) * self.lower_width(m) for m in range(len(self.rows)))

    @property
    def unique_elements(self) -> int:
        """Kept AO pairs m >= n (what the integrals compute per auxiliary function)."""
        return sum(self.width(m) * self.width(n) if m != n else self.width(m) * (self.width(m) + 1) // 2
                   for m, n in self.pairs)

    def record(self, naux: int, dense_itemsize: int = 8, stored_itemsize: int = 8) -> dict:
        """What was kept, for the result's `screening` record: fractions of pair blocks and of
        AO pairs, and the bytes of (mn|P) over naux auxiliary functions, dense against kept."""
        nblocks, npair = len(self.blocks), self.nao * (self.nao + 1) // 2
        dense = naux * self.nao * self.nao * dense_itemsize
        kept = naux * self.stored_elements * stored_itemsize
        return {"threshold": self.threshold, "blocks": nblocks,
                "block_functions": max(self.width(m) for m in range(nblocks)),
                "pair_blocks_kept": len(self.pairs), "pair_blocks": nblocks * (nblocks + 1) // 2,
                "kept_fraction": {"pair_blocks": round(len(self.pairs) / (nblocks * (nblocks + 1) / 2), 6),
                                  "elements": round(self.unique_elements / npair, 6),
                                  "stored": round(self.stored_elements / self.nao ** 2, 6)},
                "bytes": {"dense": dense, "kept": kept, "saved": dense - kept}}


def atom_blocks(shell_loc, atom_shells, block_functions) -> tuple:
    """Contiguous blocks of whole atoms of at most block_functions AOs (an atom wider than that
    alone): ((ao0, ao1, shell0, shell1), ...). shell_loc [nbas + 1]: each shell's first AO;
    atom_shells: (shell0, shell1) of each atom, in order."""
    blocks, start = [], 0
    for shell0, shell1 in atom_shells:
        if shell0 > start and shell_loc[shell1] - shell_loc[start] > block_functions:
            blocks.append((int(shell_loc[start]), int(shell_loc[shell0]), start, int(shell0)))
            start = int(shell0)
    nbas = len(shell_loc) - 1
    blocks.append((int(shell_loc[start]), int(shell_loc[nbas]), start, nbas))
    return tuple(blocks)


def screen_pair_blocks(pair_bounds, aux_bound, shell_loc, atom_shells, threshold,
                       block_functions=BLOCK_FUNCTIONS) -> ScreenedPattern:
    """The kept pair blocks: pair_bounds [nbas, nbas] = sqrt(max |(mn|mn)|) per shell pair,
    aux_bound = max_P sqrt((P|P)), threshold on the estimate q_mn * aux_bound (module docstring)."""
    blocks = atom_blocks(shell_loc, atom_shells, block_functions)
    estimate = np.asarray(pair_bounds) * float(aux_bound)
    pairs = tuple((m, n) for m, (_, _, a0, a1) in enumerate(blocks) for n, (_, _, b0, b1) in enumerate(blocks[:m + 1])
                  if m == n or float(estimate[a0:a1, b0:b1].max()) > threshold)
    return ScreenedPattern(threshold, int(shell_loc[-1]), blocks, pairs)


@dataclass(frozen=True)
class ScreeningChoice:
    """What a run decided: mode (off, auto, threshold), whether it screens, and why."""

    mode: str
    threshold: float | None
    used: bool
    reason: str

    def record(self) -> dict:
        return {"mode": self.mode, "threshold": self.threshold, "used": self.used, "reason": self.reason}


STEPS = {"mp2": "AO->MO transform", "scf": "SCF builds"}  # the steps that use (mn|P), by `screens` name


def choose_screening(mode, threshold, pattern, backend_screens, backend_name, step="mp2") -> ScreeningChoice:
    """`_choose_screening`, logged where it is decided."""
    choice = _choose_screening(mode, threshold, pattern, backend_screens, backend_name, step)
    log.debug("screening of the %s integrals: %s (%s)", step, "on" if choice.used else "off", choice.reason)
    return choice


def _choose_screening(mode, threshold, pattern, backend_screens, backend_name, step) -> ScreeningChoice:
    """Whether to screen the integrals of `step` (STEPS), from the parsed setting
    (`parse_screening`), the pattern it would use (None with mode off) and the steps the backend
    has block-sparse kernels for (its `screens`). An explicit threshold on a backend with none is
    an InputError; a step without them stays dense and the record says so; auto screens where
    the panels hold at most AUTO_MAX_STORED of the dense elements (below that the saved integrals
    and GEMMs outweigh the panels' gathers)."""
    if mode == "off":
        return ScreeningChoice(mode, None, False, option("screening", "off"))
    if not backend_screens and mode == "threshold":
        raise InputError(f"{option('screening', threshold)}: the {backend_name} backend has no block-sparse kernels; "
                         f"use {option('screening', 'off')}")
    if step not in backend_screens:
        return ScreeningChoice(mode, threshold, False,
                               f"the {backend_name} backend has no block-sparse {STEPS[step]} yet: dense")
    stored = pattern.stored_elements / pattern.nao ** 2
    if mode == "threshold":
        return ScreeningChoice(mode, threshold, True, f"asked for (threshold {threshold:g})")
    if stored <= AUTO_MAX_STORED:
        return ScreeningChoice(mode, threshold, True, f"the kept blocks hold {stored:.2f} of the dense elements "
                                                      f"(auto screens at <= {AUTO_MAX_STORED})")
    return ScreeningChoice(mode, threshold, False, f"the kept blocks would hold {stored:.2f} of the dense elements "
                                                   f"(auto screens at <= {AUTO_MAX_STORED}): compact molecule")


def screen_integrals(setting, integrals, screens, backend_name, step="mp2", block_functions=BLOCK_FUNCTIONS) -> dict:
    """Apply a --screening setting to the integral provider of `step` ("mp2" or "scf"): its
    `screening` set to the pattern when the choice screens (else None), and the record of the
    choice (`ScreeningChoice.record`, with the pattern's `ScreenedPattern.record` where one was
    made). screens: the steps the run's backend has block-sparse kernels for (its `screens`).
    Providers that are not `screenable` (Cholesky vectors, synthetic integrals) are never
    screened (an explicit threshold is an InputError)."""
    mode, threshold = parse_screening(setting)
    if mode != "off" and not integrals.screenable:
        if mode == "threshold":
            raise InputError(f"{option('screening', threshold)}: these integrals ({type(integrals).__name__}) are not "
                             f"screened; use {option('screening', 'off')}")
        return ScreeningChoice(mode, threshold, False, f"{type(integrals).__name__} are not screened").record()
    pattern = integrals.screened_pattern(threshold, block_functions) if mode != "off" and step in screens else None
    choice = choose_screening(mode, threshold, pattern, screens, backend_name, step)
    integrals.screening = pattern if choice.used else None
    return {**choice.record(), **(pattern.record(integrals.naux) if pattern is not None else {})}
