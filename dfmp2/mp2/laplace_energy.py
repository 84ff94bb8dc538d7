"""The opposite-spin MP2 energy through the Laplace transform of 1/Delta: no pair loop (SOS-MP2 and
the opposite-spin-only double hybrids; Almlof 1991; Jung, Lochan, Dutoi, Head-Gordon 2004).

    1/Delta ~ sum_k w_k exp(-t_k Delta)                                  laplace.quadrature_for / fit_quadrature
    Z^s_PQ(t_k) = sum_ia B_ia^P B_ia^Q exp(-(e_a - e_i) t_k)     per spin channel s    backend.laplace_z
    E_os(L) = - sum_k w_k sum_PQ Z^a_PQ(t_k) Z^b_PQ(t_k)          (restricted: a = b)  backend.laplace_energy
    |E_os(L) - E_os| <= eps |E_os(L)| / (1 - eps)                 eps: the quadrature's bound
Cost: n_L o v naux^2 multiply-adds (the Gram products of B scaled per row), naux^2 per point held.
Each block of B's rows is read once per pass from the same provider the canonical pair stage
uses (memory, disk, checkpoint, ranks; `b.protocol.BProvider.held_blocks`); ranks all-reduce Z.
The points of a pass are as many as the budget holds beside B (`points_per_pass`).

--laplace auto aims at AUTO_PER_ATOM Eh per atom in E_os: a priori eps = AUTO_PER_ATOM natom /
(E_OS_PER_ORBITAL n_active), an upper estimate of |E_os|; after the sum the bound is checked
against the target with the computed E_os(L), and where it is missed the quadrature is fitted
again for it and the energy made again (announced in the result's notes).
"""

from __future__ import annotations

import math

from ..util.errors import InputError, MemoryBudgetError, option
from ..util.log import log
from ..util.system_memory import MB
from .laplace import denominator_range, energy_error_bound, fit_quadrature, quadrature_for

LAPLACE_BLOCK_BYTES = 96 * MB  # the scaled rows S_ia of one Gram product: thousands of rows (a long k runs near the
# library's peak; one occupied orbital's 600 rows ran at half of it, plus an fp64 add of Z per block)
AUTO_PER_ATOM = 1e-7  # Eh: --laplace auto's target for E_os's error, per atom
E_OS_PER_ORBITAL = 0.1  # Eh: an upper estimate of |E_os| per active occupied orbital (closed-shell valence
# pairs give ~0.02-0.05; an unrestricted reference counts (alpha + beta) / 2)


def opposite_spin_only(settings) -> bool:
    """Whether the run's energy has no same-spin term: SOS-MP2, or a double hybrid with c_ss = 0."""
    return settings.method == "sos-mp2" or (settings.xc is not None and settings.c_ss == 0)


def laplace_request(settings) -> object:
    """What the run's --laplace asks for: None (the canonical pair loop), "auto" or a number of
    points. Unset (None): "auto" for a run with no same-spin term (`opposite_spin_only`) that
    forms no amplitudes (densities, gradients, t2 need the pair loop), else off."""
    request = settings.laplace
    if request is None:
        amplitudes = settings.with_rdm1 or settings.with_t2 is True
        return "auto" if opposite_spin_only(settings) and not amplitudes else None
    return None if request == "off" else request


def target_error(integrals) -> float:
    """--laplace auto's bound on |E_os(L) - E_os| (Eh): AUTO_PER_ATOM per atom; InputError where the
    integrals name no atoms (synthetic or given (ia|P)): such a run gives its points (--laplace N)."""
    natom = integrals.atoms if integrals is not None else None
    if not natom:
        raise InputError(f"{option('laplace', 'auto')} aims at 0.1 uEh per atom, and these integrals name no atoms "
                         f"(synthetic or given (ia|P)): give the number of points ({option('laplace')} N)")
    return AUTO_PER_ATOM * natom


def run_quadrature(channels, request, integrals):
    """The quadrature of the run's range of Delta (`laplace.denominator_range` over the
    opposite-spin channel pairs: InputError for a zero or negative gap): fitted for --laplace
    auto's target (`target_error`) with the a-priori |E_os| estimate, or with `request` points."""
    ends = [(ch.e_occ_host, ch.e_vir_host) for ch in channels]
    x_min, x_max = denominator_range([(ends[0], ends[-1])])
    if request == "auto":
        active = sum(ch.nocc for ch in channels) / len(channels)
        eps = target_error(integrals) / (E_OS_PER_ORBITAL * max(1.0, active))
        quadrature = quadrature_for(x_min, x_max, min(eps, 0.5))
        log.debug("Laplace quadrature: %d points for [%.4g, %.4g] Eh, bound %.3g (auto, a priori %.3g)",
                  quadrature.points, x_min, x_max, quadrature.error_bound, eps)
        return quadrature
    quadrature = fit_quadrature(x_min, x_max, request)
    log.debug("Laplace quadrature: %d points for [%.4g, %.4g] Eh, bound %.3g (asked for)", quadrature.points,
              x_min, x_max, quadrature.error_bound)
    return quadrature


def occ_rows(run, naux) -> int:
    """Occupied orbitals per Gram product: LAPLACE_BLOCK_BYTES of scaled rows (nvir naux each)."""
    nvir, nocc = max(ch.nvir for ch in run.channels), max(ch.nocc for ch in run.channels)
    return max(1, min(nocc, int(LAPLACE_BLOCK_BYTES // max(1, nvir * naux * run.backend.itemsize))))


def points_per_pass(run, naux, points) -> int:
    """Quadrature points whose Z (fp64 naux^2 per spin channel, and one product's temporaries:
    its scaled rows, `occ_rows`) the budget holds beside B (in memory) and the process: all of
    them where it can; MemoryBudgetError where not even one fits."""
    plan, nchannels = run.plan, len(run.channels)
    held = sum(ch.nocc * ch.nvir for ch in run.channels) * naux * run.backend.itemsize if plan.storage == "memory" else 0
    scaled = occ_rows(run, naux) * max(ch.nvir for ch in run.channels) * naux * run.backend.itemsize
    free = plan.budget - plan.minimum - held - scaled
    per_point = nchannels * naux * naux * 8
    room = int(max(0, free - 2 * naux * naux * 8) // per_point)
    if room < 1:
        raise MemoryBudgetError(f"the Laplace energy holds Z(t) ({per_point / MB:.4g} MB a point), more than the "
                                f"memory budget leaves ({max(0, free) / MB:.4g} MB of {plan.budget / MB:.4g} MB): "
                                "give more memory")
    if room < points:
        log.debug("Laplace: %d of %d points per pass over B (the budget)", room, points)
    return min(points, room)


def opposite_spin_sums(run, provider, quadrature) -> float:
    """E_os(L) = - sum_k w_k sum_PQ Z^a_PQ(t_k) Z^b_PQ(t_k) over the points of `quadrature`, Z
    accumulated per spin channel from the blocks of B this process holds (summed over the
    ranks: the provider's `BProvider.sum_over_ranks`), in passes of `points_per_pass` points. fp64 (Eh)."""
    backend, channels, report = run.backend, run.channels, run.context.report
    per_pass = points_per_pass(run, provider.nkept, quadrature.points)
    rows = occ_rows(run, provider.nkept)
    sums = []
    for k0 in range(0, quadrature.points, per_pass):
        exponents = quadrature.exponents[k0:k0 + per_pass]
        z = []
        for s, ch in enumerate(channels):  # Z^s(t_k) = sum_ia B_ia^T B_ia exp(-(e_a - e_i) t_k)
            z_s = backend.laplace_accumulator(len(exponents), provider.nkept)
            for i0, i1, b in provider.held_blocks(s, rows):
                z_s = backend.laplace_z(z_s, b, ch.e_occ_host[i0:i1], ch.e_vir_host, exponents)
                b = None
                report("Laplace Z(t)", i1, ch.nocc)
            z.append(provider.sum_over_ranks(backend, z_s))
        sums.extend(backend.laplace_energy(z[0], z[-1]))  # sum_PQ Z^a Z^b per point
        z = z_s = None
    return -math.fsum(w * float(e) for w, e in zip(quadrature.weights, sums))  # E_os(L) = - sum_k w_k (...)


def laplace_opposite_spin(run, provider, request) -> tuple:
    """(E_os(L) in Eh, the result's `laplace` record, notes): the quadrature for `request`
    (`laplace_request`), the sums, and for --laplace auto the a-posteriori check of its bound
    against the target (`target_error`), fitted again and summed again where missed."""
    quadrature = run_quadrature(run.channels, request, run.integrals)
    e_os = opposite_spin_sums(run, provider, quadrature)
    notes = []
    if request == "auto":
        target = target_error(run.integrals)
        if energy_error_bound(quadrature, e_os) > target:
            eps = target / (abs(e_os) + target)  # eps |E| / (1 - eps) <= target
            wider = quadrature_for(quadrature.x_min, quadrature.x_max, eps)
            notes.append(f"Laplace quadrature: {quadrature.points} points bounded E_os's error by "
                         f"{energy_error_bound(quadrature, e_os):.3g} Eh, above {option('laplace', 'auto')}'s {target:.3g} Eh; "
                         f"fitted again with {wider.points} points and summed again")
            quadrature = wider
            e_os = opposite_spin_sums(run, provider, quadrature)
    bound = energy_error_bound(quadrature, e_os)
    record = {**quadrature.record(), "request": request, "e_os_error_bound": bound,
              "target": target_error(run.integrals) if request == "auto" else None}
    log.debug("Laplace E_os = %.12f Eh, |error| <= %.3g Eh (%d points)", e_os, bound, quadrature.points)
    return e_os, record, notes


def check_method_request(settings) -> None:
    """InputError for a method's settings that do not go together, and for what the Laplace path
    does not do (once per run, from `pipeline.check_request`, before any work)."""
    if settings.method == "sos-mp2" and settings.xc is not None:
        raise InputError(f"{option('method', 'sos-mp2')} is Hartree-Fock's SOS-MP2: a double hybrid scales its own MP2 "
                         f"part (an opposite-spin-only one: {option('xc')} with {option('c_ss', 0)})")
    if settings.method == "sos-mp2" and settings.c_ss is not None:
        raise InputError(f"{option('method', 'sos-mp2')} has no same-spin term: {option('c_ss')} does not apply "
                         f"({option('c_os')} scales E_os)")
    if settings.xc is None and settings.method != "sos-mp2" and (settings.c_os is not None or settings.c_ss is not None):
        raise InputError(f"{option('c_os')}/{option('c_ss')} scale a double hybrid's MP2 part: give {option('xc')} too "
                         f"(or {option('method', 'sos-mp2')}, whose E_os {option('c_os')} scales)")
    request = laplace_request(settings)
    if request is None:
        return
    if not opposite_spin_only(settings):
        raise InputError(f"{option('laplace')} with {option('method', 'mp2')} needs the same-spin term, which the Laplace "
                         f"path does not compute yet: use {option('method', 'sos-mp2')} (or an opposite-spin-only double "
                         f"hybrid), or {option('laplace', 'off')}")
    if settings.with_rdm1 or settings.with_t2 is True:
        raise InputError(f"the Laplace path forms no amplitudes: densities, gradients and t2 need "
                         f"{option('laplace', 'off')} (the canonical pair loop, which gives SOS-MP2's density and gradient)")


def sos_energy(e_os: float, c_os: float, e_singles: float = 0.0) -> float:
    """SOS-MP2's correlation energy (Eh): c_os E_os (+ the ROHF singles, unscaled)."""
    return c_os * e_os + e_singles


