"""The sparse layer: screened, block-sparse three-center integrals (mn|P).

For an extended molecule most AO pairs (mn) are far apart and (mn|P) vanishes for every P. This
package decides which pair blocks are kept (`screening`), holds the kept blocks in row panels
(`tensor`), and says when screening pays (`screening.choose_screening`). The backends' operations on the panels
(the AO->MO half transform of the MP2 step, the SCF's J and K) are in `dfmp2.kernels`.

    estimate        |(mn|P)| <= sqrt((mn|mn)) sqrt((P|P))            (Schwarz; chem.pair_bounds)
    pair blocks     contiguous atoms of about `block_functions` AOs; the block pair (M, N) is kept
                    when any of its shell pairs' estimate exceeds the threshold
    row panels      panel_M [nP, nM, ncols_M]: row block M against the columns of every kept N
                    (both orientations: (mn|P) = (nm|P)), so that each AO->MO half transform
                    is one GEMM per row block
"""

from .screening import (SCREENING_DEFAULT, ScreenedPattern, ScreeningChoice, choose_screening, parse_screening,
                        screen_integrals, screen_pair_blocks)
from .tensor import LowerPanels, ScreenedThreeCenter

__all__ = ["SCREENING_DEFAULT", "LowerPanels", "ScreenedPattern", "ScreeningChoice", "ScreenedThreeCenter", "choose_screening",
           "parse_screening", "screen_integrals", "screen_pair_blocks"]
