"""The sparse layer: screened, block-sparse three-center integrals (mn|P), above the kernels.

For an extended molecule most AO pairs (mn) are far apart and (mn|P) vanishes for every P. This
package decides which pair blocks are kept (`screening`), holds the kept blocks in row panels
(`formats`), and says when screening pays (`screening.choose_screening`); its one block-sparse
product (`product`) serves the MP2 transform (`ao2mo`) and the SCF's builds (`scf_store`). The
backends' arithmetic on the panels is in `dfmp2.kernels` (kernels.torch.sparse, kernels.nki.sparse).

    estimate        |(mn|P)| <= sqrt((mn|mn)) sqrt((P|P))            (Schwarz; chem.pair_bounds)
    pair blocks     contiguous atoms of about `block_functions` AOs; the block pair (M, N) is kept
                    when any of its shell pairs' estimate exceeds the threshold
    row panels      panel_M [nP, nM, ncols_M]: row block M against the columns of every kept N
                    (both orientations: (mn|P) = (nm|P)), so that each AO->MO half transform
                    is one GEMM per row block
    product         X_(m, P, r) = sum_(n kept) (mn|P) F_(n r)
"""

from ..util.deprecated import MISSING as _MISSING, renamed as _renamed
from .formats import LowerPanels, ScreenedMNP
from .product import ao2mo, banded_pattern, block_sparse_product, random_screened
from .screening import (SCREENING_DEFAULT, ScreenedPattern, ScreeningChoice, choose_screening, parse_screening,
                        screen_integrals, screen_pair_blocks)

__all__ = ["SCREENING_DEFAULT", "LowerPanels", "ScreenedFittedStore", "ScreenedPattern", "ScreeningChoice",
           "ScreenedMNP", "ao2mo", "banded_pattern", "block_sparse_product", "choose_screening",
           "fitted_store", "parse_screening", "random_screened", "screen_integrals", "screen_pair_blocks"]


OLD_NAMES = {"ScreenedThreeCenter": "ScreenedMNP"}  # deprecated names (CHANGELOG.md) -> their new ones


def __getattr__(name):
    """The SCF store loads torch: imported on first use, so that a run's early integrals start
    before torch does (the driver imports this package). An old name: its new one, with a warning."""
    if name in ("ScreenedFittedStore", "fitted_store"):
        from . import scf_store

        return getattr(scf_store, name)
    found = _renamed(__name__, OLD_NAMES, name, globals())
    if found is not _MISSING:
        return found
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
