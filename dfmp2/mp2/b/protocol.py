"""B's provider protocols: where B lives, and the blocks of it the density step meets.

The pipeline (`dfmp2.mp2.pipeline`) composes the steps (`dfmp2.mp2.steps`) with one provider of each
kind; it never asks which one it holds.

BProvider: the whitened B_ia^Q of every spin channel, made (steps 1-3) or found,
and streamed to the pair stage as (task, B_I, B_J) blocks.
    provider.LocalB           one process: B in memory or on disk (out of core: each slab of B
                              whitened when the pair stage reaches it), or kept in a checkpoint,
                              or given by the caller (PySCF's ovL)
    ranks.RankB               several ranks: each holds its occupied blocks; B_J travels on a ring

DensitySchedule: the blocks of B the density step (`steps.mp2_densities`) meets, in its order.
    provider.LocalDensities   one process
    ranks.RankDensities       several ranks, in lockstep rounds
"""

from __future__ import annotations

from typing import Iterator, Protocol

import numpy as np


class BProvider(Protocol):
    """B of every spin channel, and the order the pair stage meets it in."""

    nkept: int  # auxiliary functions kept by the metric's factorisation (the columns of B)
    metric_label: str  # how the metric was factorised ("cholesky", "eigen ...", "given")
    occ_block: int  # occupied orbitals per pair-task block
    layout: dict  # what the pair tasks' split depends on (a checkpoint's pair journal belongs to it)
    reused: bool  # B came from a checkpoint

    def owned(self, tasks: list) -> list:
        """Indices of the tasks this process computes (all of them, or its ranks' share)."""

    def pair_blocks(self, tasks: list, todo: list) -> Iterator[tuple]:
        """(k, tasks[k], B_I [ni, nvir, nkept], B_J) for each k in `todo` (B_J is B_I itself for
        a diagonal task), in the order that reads (or receives) B least often."""

    def rows(self, s: int, i0: int, i1: int):
        """B rows [i0, i1) of channel s [i1 - i0, nvir, nkept] (on the device). One process only:
        what reads all of B (the density, `ovL_of_orbitals`) is refused with several ranks."""

    def combine(self, sums: np.ndarray) -> np.ndarray:
        """Every task's sums [ntasks, 2] from the ones this process computed (ranks: all-reduced)."""

    def held_blocks(self, s: int, occ_rows: int | None = None) -> Iterator[tuple]:
        """(i0, i1, B rows [i1 - i0, nvir, nkept]) of channel s that this process holds, each row
        once (the Laplace path: `dfmp2.mp2.laplace_energy`), at most occ_rows occupied orbitals a
        block where the provider can hand out views that long (None: its own blocks)."""

    def sum_over_ranks(self, backend, tensor):
        """tensor (a device array this process summed over its rows) summed over the processes."""

    def summary(self) -> dict:
        """What the provider did: {"io": scratch traffic, "distributed": per-rank record or None}."""

    def close(self) -> None:
        """Release B (a scratch file is deleted; a checkpoint's B is kept)."""


class DensitySchedule(Protocol):
    """Which blocks of B the density step takes, in order. The schedule, not the step, keeps the
    ranks in lockstep (a round in which this process takes no k block still passes every i block
    on) and gives a finished block's memory back (when the step asks for the next one)."""

    def k_blocks(self, other: int) -> Iterator[tuple]:
        """The blocks (k0, k1) of channel `other` this process takes as k, in order."""

    def slabs(self, s: int) -> Iterator:
        """B of every i of channel s, as row blocks [i1 - i0, nvir_s, nkept] in order."""

    def rows(self, s: int, i0: int, i1: int):
        """B rows [i0, i1) of channel s that this process holds."""

    def fit_blocks(self, s: int) -> Iterator[tuple]:
        """The row blocks (i0, i1) of channel s whose G this process fits, a block at a time."""

    def combine(self, array: np.ndarray) -> np.ndarray:
        """The sum over the processes that share the work."""
