"""The SCF's Coulomb and exchange builds on dfmp2's backends (PySCF's driver keeps the guess,
DIIS, damping, level shifts and convergence; `chem.use_fitted_builds` plugs these builds into it).

Long (the builds' precision policy and their set-up in one place; issue 74 splits the set-up from the policy).

    whitening, once   B^P_mn = sum_Q [L^-1]_PQ (Q|mn),  (P|Q) = L L^T     whiten_fitted_integrals
    a density         D = L diag(w) R^T  (occupied orbitals, chem.density_factors; else density_factor)
    fitted density    rho_P = sum_mn B^P_mn D_mn
    Coulomb           J_mn = sum_P rho_P B^P_mn
    exchange          K_mn = sum_P sum_r (L^T B^P)_rm w_r (R^T B^P)_rn

The backend keeps B where it computes and builds J and K (its `FittedStore`: kernels/torch/fitted.py,
kernels/nki/fitted.py). Two kinds of build: "fp32", and the store's exact kind ("fp64" on torch; on a
NeuronCore, without fp64, "exact": products of exact 7-bit slices). Precision "mixed" (the default):
fp32 builds while the density still moves, then one exact-kind "anchor" build, then increments
F(D) = F_anchor + F_fp32(D - D_anchor) whose fp32 error scales with the (small) change, re-anchored when
that error would reach the size of the SCF's steps; on torch J is fp64 in every build (only K follows
the kind). "fp64": every build in the exact kind (torch only). docs/scf.md has the measurements.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field, replace

import numpy as np

from ..kernels.protocol import FittedBuildsBackend
from ..run.context import Timer
from ..run.budget import budget_bytes, early_room
from ..util.blocks import block_ranges
from ..util.errors import InputError, MemoryBudgetError, option
from ..linalg import factor_metric, whiten
from ..util.scratch import RowFile
from ..util.start_up import stages_to_come
from ..sparse import LowerPanels
from ..util.system_memory import MB, release_freed_memory, resident_bytes

SCF_BACKENDS = ("device", "pyscf")  # device: these builds on the run's backend; pyscf: PySCF's own
SCF_PRECISIONS = ("mixed", "fp64")
EXACT_ONLY = "exact"  # not an SCF option: every build in the store's exact kind (fp64 on torch, exact-product
# slices on a NeuronCore), for the orbital response (dfmp2.mp2.response.response_mean_field)
ANCHOR_BELOW = 1e-2  # mixed: the first exact-kind build once max |D_n - D_(n-1)| is below this
FP32_RELATIVE_ERROR = 1e-3  # mixed: a new anchor once this times |D - D_anchor| exceeds |D_n - D_(n-1)|
INCREMENT_RANK_DROP = 1e-6  # mixed: eigenvalues of D - D_anchor below this times the largest are left out
# of the fp32 increment (an error of the order of the increment's own fp32 rounding)
BLOCK_BYTES = 32 * 10**6  # the largest temporary of the whitening (fp64 bytes)
FILE_BLOCK_BYTES = 512 * 10**6  # out of core: the most of the file the whitening holds at once (fp64 bytes)


def scf_builds_for(settings, backend, integrals_of, range_separated=False):
    """The Coulomb/exchange builds a run's SCF uses: a FittedCoulombExchange on `backend`, or
    None for PySCF's own. settings.scf_backend None: device where it can run (a density-fitted
    SCF without range-separated exchange), else pyscf; an explicit "device" that cannot run is an
    InputError. integrals_of(): the JK-fit integrals (called only when the builds are made);
    range_separated: the functional has long-range exchange (omega)."""
    choice, precision = settings.scf_backend, settings.scf_precision
    if choice is not None and choice not in SCF_BACKENDS:
        raise InputError(f"unknown SCF backend {choice!r} (use one of: {', '.join(SCF_BACKENDS)})")
    if precision is not None:
        check_scf_precision(precision)
    reasons = [why for why, applies in (
        (f"the conventional SCF ({option('scf', 'exact')}) builds J and K from four-center integrals in PySCF",
         settings.scf == "exact"),
        (f"the {backend.name} backend has no SCF builds", not isinstance(backend, FittedBuildsBackend)),
        ("range-separated exchange (omega) is not built by dfmp2", range_separated)) if applies]
    if choice is None:
        choice = "pyscf" if reasons else "device"
    if choice == "pyscf":
        if precision is not None:
            raise InputError(f"{option('scf_precision')} applies to dfmp2's SCF builds, not to {option('scf_backend', 'pyscf')}")
        return None
    if reasons:
        raise InputError(f"{option('scf_backend', 'device')}: {reasons[0]}; use {option('scf_backend', 'pyscf')}")
    return FittedCoulombExchange(backend, integrals_of(), precision, settings.max_memory, settings.scratch)


def check_scf_precision(precision: str) -> str:
    """`precision` as SCF_PRECISIONS spells it (any case, as Settings' keywords); else InputError."""
    name = precision.strip().lower() if isinstance(precision, str) else precision
    if name not in SCF_PRECISIONS:
        raise InputError(f"unknown SCF precision {precision!r} (use one of: {', '.join(SCF_PRECISIONS)})")
    return name


BUILD_KINDS = ("fp32", "fp64", "exact", "incremental", "coulomb")  # coulomb: a J-only build on torch (fp64)


@dataclass
class BuildRecord:
    """What the builds ran: precision per build, seconds per build, storage of B, kernel calls."""

    backend: str
    precision: str
    storage: str = ""
    naux: int = 0
    builds: list = field(default_factory=list)  # kind of each build, in order (fp32, fp64/exact, incremental)
    seconds: list = field(default_factory=list)  # wall seconds of each build
    setup_seconds: float = 0.0  # integrals (early ones: the wait for them) + whitening + storage
    increment_ranks: list = field(default_factory=list)  # columns of each incremental build's factors
    increment_forms: list = field(default_factory=list)  # how each increment was factored: the orbitals'
    # step from the anchor's (the store's increment_form) or "eigenvectors" of D - D_anchor
    metric: str = ""  # how (P|Q) was factorised
    integral_seconds: float | None = None  # JK-fit integrals computed early (a thread): its wall seconds
    integral_wait_seconds: float | None = None  # early: how long the set-up waited for them
    whitening: str = ""  # where B was whitened (device, precision)
    whitening_seconds: float = 0.0  # the set-up's metric and whitening (the integrals too, unless computed early)
    store_seconds: float = 0.0  # the set-up's copies of B into the store (squares, device copies)
    coulomb: str = ""  # how J was built (the store's coulomb_form), where the store says
    square_layout: str = ""  # the kept squares' layout (the store's square_layout), where it says
    square_choice: str = ""  # the fp64 square beside the fp32 one (cpu, mixed): kept or not, and why (util.cpu_config)
    modelled: dict = field(default_factory=dict)  # simulated NKI: target -> calibrated MODEL seconds of each build
    io: dict = field(default_factory=dict)  # B out of core: bytes of it written and read (scratch file)

    def as_dict(self) -> dict:
        return {"backend": self.backend, "precision": self.precision, "storage": self.storage,
                "naux": self.naux, "whitening": self.whitening, "builds": len(self.builds),
                **{f"{kind}_builds": self.builds.count(kind) for kind in BUILD_KINDS},
                "build_kinds": list(self.builds), "build_seconds": [round(s, 4) for s in self.seconds],
                "setup_seconds": round(self.setup_seconds, 4), "integrals": "set-up" if self.integral_seconds is None else "early (a thread from the start-up on)",
                **({"integral_seconds": round(self.integral_seconds, 4),
                    "integral_wait_seconds": round(self.integral_wait_seconds, 4)}
                   if self.integral_seconds is not None else {}),
                "whitening_seconds": round(self.whitening_seconds, 4), "store_seconds": round(self.store_seconds, 4),
                **({"square_choice": self.square_choice} if self.square_choice else {}),
                **({"coulomb": self.coulomb} if self.coulomb else {}),
                **({"square_layout": self.square_layout} if self.square_layout else {}),
                "increment_ranks": list(self.increment_ranks),
                "increment_forms": list(self.increment_forms),
                **({"io": dict(self.io)} if self.io else {}),
                **({"modelled_build_seconds": {t: [round(x, 6) for x in v] for t, v in self.modelled.items()},
                    "modelled_note": "calibrated MODEL of each build on each target, not a measurement"}
                   if self.modelled else {})}


def fitted_bytes(integrals) -> int:
    """Bytes of the JK-fit integrals the builds keep in fp64: the lower triangles [naux, nao (nao + 1) / 2],
    or with integrals.screening each kept pair block once (LowerPanels [naux, lower elements])."""
    pattern = integrals.screening
    nao, naux = integrals.nao, integrals.naux
    return naux * (nao * (nao + 1) // 2 if pattern is None else pattern.lower_elements) * 8


def early_integrals_fit(integrals, max_memory) -> bool:
    """Whether the budget (MB, None: the default, `budget.memory_budget`) will hold the JK-fit integrals
    (`fitted_bytes`) and the builds' temporaries once the backend is loaded and the SCF runs (what
    they add counted: `budget.early_room`): they may then be computed early (`chem.EarlyIntegrals`);
    else the set-up computes them, or refuses the budget, as usual."""
    return fitted_bytes(integrals) + 4 * BLOCK_BYTES <= early_room(max_memory, stages_to_come(scf=True))


def whitening_backend(backend):
    """Where the JK-fit whitening runs: on `backend` where it has fp64, else (a NeuronCore) on the
    host CPU in fp64: B feeds every build, and its fp32 rounding (1e-7 relative) would cost
    ~1e-5 Eh of the SCF energy whatever the builds' own precision."""
    if backend.has_fp64:
        return backend
    from ..kernels import host_fp64_backend

    return host_fp64_backend()


def whiten_fitted_integrals(backend, integrals, factor=None):
    """B^P_(mn) = sum_Q [L^-1]_PQ (Q|mn) on `backend` (one with fp64: `whitening_backend`), host
    fp64, whitened in place of the integrals: over the pairs m >= n [nkept, npair], or with
    integrals.screening the kept pair blocks, each once (a sparse.LowerPanels of nkept auxiliary
    functions); and the metric factor (`factor`: the one the run has of this fitting set, else made here)."""
    rows = integrals.fitted_rows()  # [naux, npair], or screened LowerPanels [naux, nM, nlow_M], fp64
    factor = factor if factor is not None else factor_metric(backend, integrals.metric())
    if isinstance(rows, LowerPanels):
        return rows.map(lambda p: whiten_columns(backend, factor, p.reshape(p.shape[0], -1)).reshape(
            factor.nkept, *p.shape[1:])), factor
    return whiten_columns(backend, factor, rows), factor


def whiten_columns(backend, factor, x):
    """x [naux, ncols] host fp64 -> L^-1 x [nkept, ncols] (in place where nkept = naux), in column
    blocks of BLOCK_BYTES."""
    out = np.empty((factor.nkept, x.shape[1])) if factor.nkept != x.shape[0] else x
    for c0, c1 in block_ranges(x.shape[1], max(64, BLOCK_BYTES // (8 * x.shape[0]))):
        # B^T = X^T L^-T  on a block of pair columns
        block = backend.to_device(x[:, c0:c1].T, fp64=True)  # a transposed view: no copy
        out[:, c0:c1] = backend.to_host(whiten(backend, factor, block)).T
    return out


def whiten_to_file(backend, integrals, scratch=None, block_bytes=None, factor=None):
    """B^P_(mn) = sum_Q [L^-1]_PQ (Q|mn) out of core: (Q|mn) [naux, ncols] written to a scratch
    RowFile in auxiliary blocks, then whitened in place, block of columns by block (each block's
    columns depend on that block alone): B [nkept, ncols] is its first nkept rows. Columns: the
    pairs m >= n (npair), or with integrals.screening the kept pair blocks each once,
    LowerPanels.flat's order (lower_elements). Holds about two blocks of block_bytes (default
    BLOCK_BYTES; a block of whole auxiliary shells at least). -> (B's RowFile, the metric factor: `factor`
    where the run has one of this fitting set, else made here)."""
    block_bytes = block_bytes or BLOCK_BYTES
    factor = factor if factor is not None else factor_metric(backend, integrals.metric())
    naux, nao, pattern = integrals.naux, integrals.nao, integrals.screening
    ncols = nao * (nao + 1) // 2 if pattern is None else pattern.lower_elements
    rows = RowFile((naux, ncols), scratch)
    try:
        for p0, p1 in integrals.aux_blocks(max(1, block_bytes // (8 * ncols))):
            rows.write_rows(p0, integrals.packed_rows(p0, p1) if pattern is None
                            else integrals.screened_lower(p0, p1).flat())
        for c0, c1 in block_ranges(ncols, max(64, block_bytes // (8 * naux))):
            # B^T = X^T L^-T  on a block of columns, in place
            rows.write_columns(c0, whiten_columns(backend, factor, rows.read_columns(c0, c1)))
    except BaseException:
        rows.close()
        raise
    rows.shape = (factor.nkept, ncols)  # (rows nkept.. of the file, if any, are left unread)
    return rows, factor


class FittedCoulombExchange:
    """J and K of the SCF from whitened JK-fit integrals, on one backend. backend: one with SCF builds
    (`FittedBuildsBackend`); integrals: the JK-fit BasisSetIntegrals (`dfmp2.run.providers`); precision:
    mixed or fp64 (SCF_PRECISIONS; mixed only on a device without fp64); max_memory: the run's budget (MB,
    None: the default, `budget.memory_budget`, within `rule()`: e.g. PySCF's default as one more limit,
    `budget.caller_limit`); scratch: where B goes when the budget does not hold it (`scratch.scratch_root`);
    metric_factor: the factor of `integrals`' metric another build of the run made (`metric_factor_of`
    vouches that it is), else None (factorised here). Built on the first call (`get_jk`), released by
    `close()`; metric_factor is then the one it whitened with, kept for the run's later users of the same
    fitting set, until `reset` hands the builds other integrals."""

    def __init__(self, backend, integrals, precision=None, max_memory=None, scratch=None, metric_factor=None,
                 rule=nullcontext):
        precision = precision or "mixed"
        if precision != EXACT_ONLY:
            precision = check_scf_precision(precision)
        if precision == "fp64" and not backend.has_fp64:
            raise InputError(f"{backend.device_name} has no fp64 arithmetic: its SCF builds are mixed "
                             f"(fp32, with exact-product anchors); leave out {option('scf_precision')}")
        self.backend, self.integrals, self.max_memory, self.scratch, self.rule = (backend, integrals, max_memory,
                                                                                 scratch, rule)
        self.record = BuildRecord(backend=backend.name, precision=precision)
        self._store = None  # the backend's copy of B (FittedStore)
        self._last = None  # the previous call's densities (mixed precision)
        self._anchor = None  # (densities, J or None, K or None) the incremental builds start from
        self.metric_factor = metric_factor  # linalg.MetricFactor of self.integrals' metric, once made or given

    # ---- set-up ------------------------------------------------------------------------
    def _build(self):
        waited = self.integrals.waited if self.integrals.early else 0.0  # (the budget check before the SCF waits too)
        with Timer().lap() as lap:
            early = self._set_up()
        self.record.setup_seconds = lap.seconds
        if early:  # the thread's time and the set-up's wait for it
            self.record.integral_seconds, self.record.integral_wait_seconds = (self.integrals.seconds,
                                                                               self.integrals.waited - waited)

    def _set_up(self) -> bool:
        """B whitened, and kept by the backend's store (in memory or a scratch file). Returns whether
        the integrals were computed early (on a thread)."""
        backend, integrals = self.backend, self.integrals
        self.nao = nao = integrals.nao
        triangle = fitted_bytes(integrals)
        early = integrals.early  # chem.EarlyIntegrals: computed on a thread from the start-up on
        held = integrals.held_bytes() if early else 0  # (resident already)
        free = self._free_bytes()
        whitener = whitening_backend(backend)
        streams = backend.fitted_store_on_disk  # its store reads B from a scratch file
        with Timer().lap() as whitening:  # (early integrals: waited for in held_bytes, above)
            if triangle - held + 4 * BLOCK_BYTES <= free:
                rows, factor = whiten_fitted_integrals(whitener, integrals, _on_device(self.metric_factor, whitener))
            elif not streams:
                raise MemoryBudgetError(
                    f"dfmp2's SCF builds keep the whitened JK-fit integrals in memory ({triangle / MB:.0f} MB, "
                    f"{free / MB:.0f} MB left in the budget) on {backend.device_name}: raise {option('max_memory')} "
                    f"or use {option('scf_backend', 'pyscf')}")
            else:  # out of core: B in a scratch file, read once per build
                if held:
                    integrals.fitted_rows()  # what the early thread made goes (held: it did not fit beside B's blocks)
                # its temporaries (about four blocks) within what the budget leaves; large column blocks
                # where it allows: each block's read is one piece of every row of the file
                rows, factor = whiten_to_file(whitener, integrals, self.scratch,
                                              max(10**6, min(FILE_BLOCK_BYTES, (free + held) // 8)),
                                              _on_device(self.metric_factor, whitener))
        self.record.whitening_seconds = whitening.seconds
        kinds = {"mixed": ["fp32", "exact"], "fp64": ["exact"], EXACT_ONLY: ["exact"]}[self.record.precision]
        on_disk = {"pattern": integrals.screening} if isinstance(rows, RowFile) else {}
        from ..sparse import fitted_store  # loads torch (not needed before the store)

        with Timer().lap() as storing:
            store = fitted_store(backend, rows, nao, kinds, self._free_bytes, **on_disk)
            del rows
            release_freed_memory()
        self.record.store_seconds = storing.seconds
        self._store = store
        self.naux = self.record.naux = store.naux
        self.record.storage = store.storage
        self.record.coulomb = getattr(store, "coulomb_form", "")
        self.record.square_layout = getattr(store, "square_layout", "")
        chosen = getattr(store, "square_choice", None)
        if chosen is not None:
            self.record.square_choice = (f"fp64 square {'wanted (kept where the budget holds it)' if chosen.value else 'not kept'}: "
                                         f"{chosen.source}")
        self.record.metric = factor.describe()
        self.metric_factor = factor
        self.record.whitening = f"{whitener.device_name}, fp64"
        return early

    def metric_factor_for(self, integrals):
        """The factor these builds hold (made or given) where it is of `integrals`' metric too (the same
        auxiliary functions at the same centres: `fitting_key`), else None."""
        if self.metric_factor is None or not _same_key(fitting_key(self.integrals), fitting_key(integrals)):
            return None
        return self.metric_factor

    def _free_bytes(self):
        """What the budget leaves: the process's (within `rule`), on a GPU at most 90% of its free memory."""
        with self.rule():
            free = budget_bytes(self.max_memory) - resident_bytes()
        device_free = self.backend.memory_limit_bytes()
        return free if device_free is None else min(free, int(0.9 * device_free))

    # ---- builds ------------------------------------------------------------------------
    def _build_plan(self, dms, with_j, with_k):
        """How to build F of `dms` (the precision policy, module docstring): (kind, anchor) with
        kind "fp32", the store's exact kind, or "incremental" (anchor: the one to start from);
        anchor "new" when this build becomes the anchor."""
        exact = self._store.exact_kind
        if self.record.precision != "mixed" or not (with_k or self._store.coulomb_follows_kind):
            return exact, None  # every build exact; or J alone, which this store builds exactly anyway
        last, self._last = self._last, np.array(dms)
        anchor = self._anchor
        usable = anchor is not None and anchor[0].shape == dms.shape and \
            (not with_j or anchor[1] is not None) and (not with_k or anchor[2] is not None)
        if last is None or last.shape != dms.shape:
            return (exact, "new") if usable else ("fp32", None)
        step = float(np.abs(dms - last).max())
        if not usable:
            return (exact, "new") if step < ANCHOR_BELOW else ("fp32", None)
        drift = float(np.abs(dms - anchor[0]).max())
        return (exact, "new") if drift * FP32_RELATIVE_ERROR > step else ("incremental", anchor)

    def get_jk(self, dms, factors, with_j=True, with_k=True, hermi=1):
        """J and K of densities dms [nset, nao, nao] (host fp64), each given as factors (L [nao, r],
        R [nao, r] or None, w [r] or None) with D = L diag(w) R^T, or None: factored here
        (`density_factor`; hermi=0: not symmetric). Returns (vj, vk) host fp64 [nset, nao, nao]
        (None where not asked), in the policy's kind."""
        if self._store is None:
            self._build()
        before = self._modelled_so_far()
        with Timer().lap() as lap:
            vj, vk, how = self._built(dms, factors, with_j, with_k, hermi)
        self.record.builds.append(how)
        self.record.seconds.append(lap.seconds)
        if before is not None:
            for target, seconds in self._modelled_so_far().items():
                self.record.modelled.setdefault(target, []).append(seconds - before[target])
        return vj, vk

    def _built(self, dms, factors, with_j, with_k, hermi) -> tuple:
        """(vj, vk, the kind of build that ran) of get_jk's densities."""
        factors = [f if f is not None else density_factor(d, hermi) for f, d in zip(factors, dms)]
        how, anchor = self._build_plan(dms, with_j, with_k)
        if how == "incremental":
            # F(D) = F_exact(D_anchor) + F_fp32(D - D_anchor): the fp32 error scales with |D - D_anchor|
            d_anchor, j_anchor, k_anchor, anchor_factors = anchor
            delta = dms - d_anchor
            steps = orbital_steps(factors, anchor_factors) if self._store.orbital_increments else None
            if steps is not None:  # D = (L_a + E)(L_a + E)^T: fp32 error proportional to E
                vj, vk = self._store.build_increment(delta, anchor_factors, steps, with_j, with_k)
                self.record.increment_forms.append(self._store.increment_form)
                self.record.increment_ranks.append(sum(step.shape[1] for step in steps))
            else:  # D - D_anchor = V diag(sign) V^T, twice the orbitals' rank
                delta_factors = [symmetric_factors(d, INCREMENT_RANK_DROP) for d in delta]
                vj, vk = self._store.build(delta, delta_factors, "fp32", with_j, with_k)
                self.record.increment_forms.append("eigenvectors")
                self.record.increment_ranks.append(sum(left.shape[1] for left, _, _ in delta_factors))
            vj = j_anchor + vj if with_j else None
            vk = k_anchor + vk if with_k else None
        else:
            vj, vk = self._store.build(dms, factors, how, with_j, with_k, anchor=anchor == "new")
            if anchor == "new":
                copy = lambda v: None if v is None else v.copy()  # noqa: E731  (PySCF scales vk in place)
                self._anchor = (np.array(dms), copy(vj), copy(vk), factors)
        if not with_k and not self._store.coulomb_follows_kind:
            how = "coulomb"
        return vj, vk, how

    def _modelled_so_far(self):
        """Calibrated MODEL seconds of everything the backend ran so far, per target (a simulated
        NKI backend), else None."""
        modelled = self.backend.modelled()  # ({} where nothing is modelled)
        return {target: m["seconds"] for target, m in modelled.items()} if modelled else None

    def reset(self, integrals):
        """Use `integrals` (another molecule's) from the next build on (their metric factorised anew)."""
        self.close()
        self.integrals, self.metric_factor = integrals, None

    def close(self):
        """Release B (the SCF is done; a later get_jk builds it again)."""
        if self._store is not None:
            self.record.io = getattr(self._store, "io", dict)() or self.record.io
            self._store.close()
        self._store = self._last = self._anchor = None
        release_freed_memory()


def orbital_steps(factors, anchor_factors):
    """E = L Q - L_anchor per density, Q [r, r] the rotation of the orbitals L that brings them
    closest to the anchor's (orthogonal Procrustes: Q = U V^T of svd(L^T L_anchor)); L Q (L Q)^T is
    still D. None unless every density and its anchor are given as orbitals, D = L L^T, of one shape."""
    steps = []
    for (left, right, weights), (anchor, anchor_right, anchor_weights) in zip(factors, anchor_factors):
        if any(x is not None for x in (right, weights, anchor_right, anchor_weights)) or left.shape != anchor.shape:
            return None
        u, _, vt = np.linalg.svd(left.T @ anchor)
        steps.append(left @ (u @ vt) - anchor)
    return steps


def symmetric_factors(d, drop=1e-14, floor=0.0):
    """(L [nao, r], None, w [r]) with L diag(w) L^T = d for a symmetric d [nao, nao]: eigenvectors scaled by
    |eigenvalue|^1/2, w their signs; those at most drop x max(floor, the largest |eigenvalue|) left out."""
    w, v = np.linalg.eigh(d)
    largest = max(floor, float(np.abs(w).max()))
    keep = np.abs(w) > drop * largest if largest > 0 else np.zeros(len(w), dtype=bool)
    return v[:, keep] * np.sqrt(np.abs(w[keep])), None, np.sign(w[keep])


def density_factor(d, hermi=1, drop=1e-14):
    """Factors (L, R or None, w or None) with D = L diag(w) R^T of a density d [nao, nao] that came
    without orbitals: eigenvectors if it is symmetric (hermi=1, or equal to its transpose), else
    singular vectors; components below drop (relative to max(1, the largest)) left out."""
    if hermi == 1 or np.allclose(d, d.T, rtol=0, atol=1e-13):
        return symmetric_factors((d + d.T) / 2, drop, floor=1.0)
    u, s, vt = np.linalg.svd(d)
    keep = s > drop * max(1.0, s.max())
    return u[:, keep] * s[keep], np.ascontiguousarray(vt[keep].T), None


def metric_factor_of(builds, integrals):
    """The factor of `integrals`' metric `builds` (this run's J/K builds, or None) hold, else None."""
    return builds.metric_factor_for(integrals) if builds is not None else None


def fitting_key(integrals) -> tuple:
    """What a fitting set's metric (P|Q) is made of: copies of its auxiliary molecule's _atm, _bas, _env."""
    auxmol = integrals.auxmol
    return tuple(np.array(table) for table in (auxmol._atm, auxmol._bas, auxmol._env))


def _on_device(factor, backend):
    """`factor` (or None) on `backend`'s device: the SCF's builds may have made it on another
    (use_dfmp2_jk's device) than the response's whitening."""
    if factor is None or factor.matrix.device == backend.device:
        return factor
    return replace(factor, matrix=factor.matrix.to(backend.device), _cast={})


def _same_key(a: tuple, b: tuple) -> bool:
    return all(x.shape == y.shape and bool(np.array_equal(x, y)) for x, y in zip(a, b))
