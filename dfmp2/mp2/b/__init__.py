"""B, in one package: where B_ia^Q = sum_P (ia|P) [L^-T]_PQ comes from, where it lives, and how
the pair stage and the densities meet it.

    protocol    `BProvider`, `DensitySchedule`: what the pipeline asks of B's providers
    provider    `b_provider`: B given by the caller (`given_b`), over the ranks (`b_over_ranks`),
                or made or found in this process (`local_b`, `LocalB`); steps 1-3 composed once
                (`MetricFactorOnce`, `make_iaP`, `whiten_blocks`) and alone (`ovL_of_orbitals`);
                `LocalDensities`
    ranks       B's blocks over the ranks: the all-to-all, the ring (`RankB`), the densities in
                lockstep (`RankDensities`)
    ovl_files   B in PySCF's ovL files (`write_ovl`, `open_ovl`)

B's stores (`MemoryStore`, `DiskStore`) stay in `dfmp2.run.storage`: the checkpoint (run layer,
which chem imports) reopens a kept B as a DiskStore. This namespace holds what the other
modules import."""

from .ovl_files import open_ovl, ovl_names, write_ovl
from .protocol import BProvider, DensitySchedule
from .provider import LocalB, LocalDensities, MetricFactorOnce, b_provider, ovL_of_orbitals
from .ranks import RankB, RankDensities

__all__ = ["BProvider", "DensitySchedule", "LocalB", "LocalDensities", "MetricFactorOnce", "RankB", "RankDensities",
           "b_provider", "open_ovl", "ovL_of_orbitals", "ovl_names", "write_ovl"]
