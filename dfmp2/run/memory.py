"""The block sizes that keep a run within its memory budget.

The budget (`budget.memory_budget`, the one rule of every entry point) bounds the resident memory
of the whole process (MB = 10^6 bytes, as in PySCF), its own footprint included (Python, torch,
PySCF, the SCF's arrays): the plan gives the pipeline's arrays what is left above the resident
set measured when the plan is made, and a budget below that footprint is bad input. On a GPU, the
device arrays are also held to 90% of its free memory.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..kernels.protocol import fp64_pair_temporaries_bytes
from ..util.errors import MemoryBudgetError, option
from ..util.log import log
from ..util.system_memory import MB, release_freed_memory, resident_bytes
from ..util.start_up import SCF_GROWTH, start_up_bytes
from .budget import budget_bytes, limit_needed, memory_budget

MIN_AUX_BLOCK = 32  # auxiliary functions per transform block, unless the budget forces fewer
# what the orbital response's J/K add beside the gradient's own arrays when PySCF builds them
# (--scf-backend pyscf, or an exact reference): its DF buffers out of core, where the budget
# leaves no room for its in-core integrals (measured 25 MB on hexane/cc-pVDZ); allowed for
# when a gradient's budget is checked before the SCF
RESPONSE_JK_GROWTH = 32 * MB


@dataclass
class MemoryPlan:
    """Block sizes and storage chosen from a memory budget (bytes)."""

    budget: int  # the whole process's (bytes)
    aux_block: int  # auxiliary functions per AO->MO transform block
    occ_block: int  # occupied orbitals per whitening / pair-energy block
    storage: str  # 'memory' or 'disk' for the [nocc, nvir, naux] tensor
    minimum: int  # smallest budget that could run at all (bytes, the baseline included)
    slab_rows: int = 0  # occupied rows of B read at once in the pair stage (a multiple of occ_block)
    baseline: int = 0  # the process's resident memory when the plan was made (bytes)
    pair_elements: int = 0  # (ia|jb) elements the pair stage forms (about; i <= j within a channel)
    budget_source: str = ""  # what set the budget: --max-memory, or the limit that allowed least (memory_budget)
    budget_note: str = ""  # the user's figure lowered by a limit, or above free memory (memory_budget), else ""
    budget_limits: tuple = ()  # every limit found, each with what it allows (memory_budget)
    budget_binding: object = None  # the MemoryLimit that set the budget, None for --max-memory (`limit_needed`)


@dataclass(frozen=True)
class TensorSizes:
    """The sizes a memory plan depends on: nao basis functions, spaces [(nocc, nvir)] of active
    orbitals per spin channel (one: restricted; two: alpha, beta, both tensors stored), naux
    auxiliary functions, the widest auxiliary shell, and itemsize, the bytes per element of the
    stored (ia|P) / B."""

    nao: int
    spaces: list
    naux: int
    largest_shell: int
    itemsize: int


def default_hints():
    """A backend's plan preferences when none are given (the torch CPU backend's pair rows)."""
    from ..kernels.protocol import PlanHints

    return PlanHints(aux_block_bytes=None, pair_rows=512, occ_block_limit=None,
                     pair_scratch_bytes=fp64_pair_temporaries_bytes)


def plan_memory(budget, sizes: TensorSizes, hints=None, *, on_disk=False, baseline=0, device_limit=None,
                ranks=1, growth=0, gamma=False, source=None) -> MemoryPlan:
    """Choose block sizes so that the working set of each step fits `budget` bytes, the whole
    process's: `baseline` bytes are already resident (the arrays get budget - baseline, and
    at most `device_limit` bytes on a GPU).

    hints: the backend's preferences (`kernels.protocol.PlanHints`; default `default_hints`):
    aux_block_bytes, the size of one block of unpacked (mn|P) (None: as large as fits);
    pair_rows, the (i, a) rows of one pair-energy GEMM (small blocks waste less on the
    diagonal blocks I = J, large ones keep a GPU busy); occ_block_limit, the most occupied
    orbitals one pair-energy kernel can hold (e.g. on-chip memory); pair_scratch_bytes(nb,
    nvir), the memory one pair-energy call needs beyond its B blocks. on_disk: B kept on disk
    whatever the budget. ranks > 1: each of `ranks` processes holds about 2/ranks of the
    tensor (dfmp2.run.ranks), in memory, or its own 1/ranks on disk and a few blocks in memory. growth: bytes of `baseline` allowed for what the
    SCF will leave (named in the messages). gamma: the densities' three-index G is kept too
    (fp64, beside B: in memory or on disk with it), fitted a block of occ_block rows at a time.
    source: what set the budget (`MemoryBudget.source`; None: --max-memory).

    Long (~80 lines) because the three steps' working sets, the storage decision and the block
    sizes are one budget: split, each part would need the others' results.
    """
    hints = hints or default_hints()
    nao, spaces, naux, largest_shell, itemsize = (sizes.nao, sizes.spaces, sizes.naux, sizes.largest_shell,
                                                  sizes.itemsize)
    preferred_aux_block_bytes, preferred_pair_rows = hints.aux_block_bytes, hints.pair_rows
    occ_block_limit, pair_scratch_bytes = hints.occ_block_limit, hints.pair_scratch_bytes
    nocc = max(o for o, _ in spaces)
    nvir = max(v for _, v in spaces)
    # (P|Q), its factor (+ an fp32 copy), or eigh's vectors, workspace and projector; C per spin
    fixed = 5 * naux * naux * 8 + 2 * len(spaces) * nao * nao * 8

    def transform_bytes(nP):  # fp64: packed integrals and their C-ordered copy, unpacked, device
        # copy, half and full transform
        return nP * 8 * (nao * (nao + 1) + 2 * nao * nao + 2 * nao * nocc + 2 * nocc * nvir)

    def pair_bytes(nb):  # two B blocks (+ host copies) and the backend's temporaries
        scratch = (pair_scratch_bytes or fp64_pair_temporaries_bytes)(nb, nvir)
        return 4 * nb * nvir * naux * itemsize + scratch

    def whiten_bytes(nb):  # (and with gamma the fit of G's rows: G~, B in fp64, the fitted rows)
        return max(4 * nb * nvir * naux * itemsize, 3 * nb * nvir * naux * 8 if gamma else 0)

    store = sum(o * v for o, v in spaces) * naux * (itemsize + (8 if gamma else 0))
    if ranks > 1:  # this rank's rows and one visiting rank's (or its columns and its rows)
        store = min(store, -(-store * 2 // ranks))
    least = fixed + max(transform_bytes(largest_shell), pair_bytes(1), whiten_bytes(1))
    resident = (f"{baseline / MB:.4g} MB already resident" if not growth else
                f"{baseline / MB:.4g} MB resident ({(baseline - growth) / MB:.4g} MB of footprint now and {growth / MB:.3g} "
                "MB allowed for what the SCF leaves)")
    source = source or option("max_memory")
    stated = (f"{source} {budget / MB:.4g} MB" if source == option("max_memory") else
              f"the default memory budget {budget / MB:.4g} MB ({source})")
    if budget <= baseline:
        raise _short(f"{stated} is below this process's own footprint: {resident} (Python, torch, "
                     f"PySCF and the reference); give at least {(baseline + least) / MB:.4g} MB", baseline + least)
    arrays = budget - baseline if device_limit is None else min(budget - baseline, device_limit)
    if least > arrays:
        where = "" if device_limit is None or budget - baseline <= device_limit else " of GPU memory"
        raise _short(f"needs at least {(baseline + least) / MB:.4g} MB even in the smallest blocks ({least / MB:.3g} MB"
                     f"{where} above the {resident}; nao={nao}, nocc={nocc}, nvir={nvir}, "
                     f"naux={naux}); the memory budget is {budget / MB:.4g} MB ({source})", baseline + least)
    storage = "memory" if least + store <= arrays and not on_disk else "disk"
    room = arrays - fixed - (store if storage == "memory" else 0)

    aux_block = naux
    if preferred_aux_block_bytes:  # but at least MIN_AUX_BLOCK functions, to keep GEMMs efficient
        aux_block = min(naux, max(largest_shell, MIN_AUX_BLOCK, preferred_aux_block_bytes // (8 * nao * nao)))
    while aux_block > largest_shell and transform_bytes(aux_block) > room:
        aux_block = max(largest_shell, aux_block // 2)

    occ_block = min(nocc, occ_block_limit or nocc, max(1, -(-preferred_pair_rows // max(nvir, 1))))
    # out of core, the pair blocks take at most half of what is left: the other half holds the
    # B_I slab that B_J blocks stream against (fewer slabs, fewer reads)
    limit = room if storage == "memory" else room // 2
    while occ_block > 1 and max(pair_bytes(occ_block), whiten_bytes(occ_block)) > limit:
        occ_block -= 1
    slab_rows = nocc
    if storage == "disk":  # an I slab of B in what the pair blocks (with their B_J) leave
        row = nvir * naux * itemsize
        slabs = max(occ_block, (room - pair_bytes(occ_block)) // row)
        slab_rows = min(nocc, slabs // occ_block * occ_block)
    pair_elements = sum((o * v) * (ot * vt) // (1 + (s == t)) for s, (o, v) in enumerate(spaces)
                        for t, (ot, vt) in enumerate(spaces) if t <= s)
    log.debug("memory plan: budget %.0f MB (%s), (ia|P) in %s, aux block %d, occ block %d, I slab %d rows, "
              "least %.0f MB", budget / 2 ** 20, source, storage, aux_block, occ_block, slab_rows,
              (baseline + least) / 2 ** 20)
    return MemoryPlan(budget, aux_block, occ_block, storage, baseline + least, slab_rows, baseline, pair_elements,
                      budget_source=source)


def _short(message, need) -> MemoryBudgetError:
    """The refusal of a budget that cannot hold the run, with `need`, the bytes of budget it would take."""
    error = MemoryBudgetError(message)
    error.need = need
    return error


def plan_for(backend, integrals, spaces, max_memory, on_disk=False, ranks=1, growth=0, gamma=False, held=0,
             stages=()) -> MemoryPlan:
    """The memory plan of a run with active spaces [(nocc, nvir)] per spin channel (on_disk:
    B kept on disk whatever the budget, as a checkpoint does). growth: bytes the process is
    expected to add to its resident set before the MP2 steps (a check made before the SCF
    allows SCF_GROWTH for what the SCF leaves behind); held: bytes of the resident set that are
    the run's own arrays and gone by then (the SCF's early integrals: `chem.EarlyIntegrals`), not
    its footprint; stages: the start-up stages still to come (`util.start_up.START_UP`), whose address
    space is taken from the rlimits. gamma: G kept beside B (plan_memory)."""
    hints = backend.plan_hints(max(v for _, v in spaces), integrals.naux)
    release_freed_memory()  # the footprint measured is what is in use, not freed pages the heap keeps
    baseline = resident_bytes() - held + growth
    device_free = backend.memory_limit_bytes()
    sizes = TensorSizes(integrals.nao, spaces, integrals.naux, integrals.largest_shell(), backend.itemsize)
    budget = memory_budget(max_memory, baseline, start_up_bytes(stages))
    try:
        plan = plan_memory(budget.size, sizes, hints, on_disk=on_disk, baseline=baseline,
                           device_limit=None if device_free is None else int(0.9 * device_free), ranks=ranks,
                           growth=growth, gamma=gamma, source=budget.source)
    except MemoryBudgetError as error:  # in the terms of the limit that set the budget, what it would need
        raise MemoryBudgetError(f"{error}{limit_needed(budget.binding, budget.size, error.need)}") from None
    return replace(plan, budget_note=budget.note, budget_limits=budget.limits, budget_binding=budget.binding)


GRADIENT_AUX_BLOCK = 128  # auxiliary functions per block of the gradient's passes, where the budget allows


def free_bytes(max_memory) -> int:
    """What the budget leaves now (bytes; negative when the process is already beyond it), the
    heap's freed pages handed back first."""
    release_freed_memory()
    return budget_bytes(max_memory) - resident_bytes()


def gradient_aux_block(max_memory, nao: int) -> int:
    """Auxiliary functions per block of the gradient's passes over (mn|P) and its derivative
    integrals: what half of the budget left now holds at ~6 fp64 [nao, nao] per function
    (the block, its copies, the three derivative components), between 1 and GRADIENT_AUX_BLOCK
    (the smallest blocks are in the check made before the SCF: gradient_least_bytes)."""
    return int(min(GRADIENT_AUX_BLOCK, max(1, free_bytes(max_memory) // 2 // (48 * nao * nao))))


def reference_least_bytes(naux_jk: int, nao: int, nocc: list) -> int:
    """The DF reference term's arrays (gradient.reference_fitting_densities) in the least
    memory: the JK-fit metric and its factor, and one occupied orbital's block of its
    [naux, nao, nocc_s] arrays (4 copies: read, solved, reordered, Y d); the arrays themselves
    go to disk where the budget does not hold them."""
    return 2 * naux_jk * naux_jk * 8 + 4 * naux_jk * nao * 8


def reference_arrays_bytes(naux_jk: int, nao: int, nocc: list) -> int:
    """The DF reference term's [naux, nao, nocc_s] arrays of every spin (fp64)."""
    return sum(naux_jk * nao * n * 8 for n in nocc)


def gradient_least_bytes(nao: int, naux: int, naux_jk: int, nocc: list, response_jk: int) -> int:
    """What a gradient adds, at the least, to the MP2 steps' own least (G, fp64, is counted by
    their plan): the MP2 metric and its factor, one auxiliary function's blocks of the passes
    over (mn|P) and its derivatives, the DF reference's least (reference_least_bytes; none for
    an exact reference: naux_jk 0) and response_jk, what the orbital response's J/K hold
    (RESPONSE_JK_GROWTH for PySCF's; dfmp2's builds: their triangle and temporaries)."""
    return (2 * naux * naux * 8 + 48 * nao * nao + (reference_least_bytes(naux_jk, nao, nocc) if naux_jk else 0)
            + response_jk)
