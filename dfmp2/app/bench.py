"""`dfmp2 bench`: the DF-MP2 pipeline on a synthetic problem, timed per stage.

A cold pass (first call: allocations, caches; kernel compiles on Trainium) is followed by
`repeat` warm passes; per stage the warm median is reported with the stage's GFLOP and the
achieved TFLOPS. `repeat` 0 times the cold pass alone (shapes whose one pass takes minutes;
the record says `timed_passes: "cold"`). GFLOP are those of dfmp2's algorithm (pair energies over blocks I >= J,
diagonal blocks in full); `nominal_gflop` follows the published sibling convention (all
nocc^2 pairs, no symmetry) so numbers can be compared with theirs.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import time
from dataclasses import dataclass

from ..api.result import MODEL_NOTE, memory_record, model_record
from ..kernels import HOST, MP2_ENERGY_KERNELS, TRAINIUM, backend_for, get_backend, runs_nki
from ..mp2.pipeline import dfmp2_energy
from ..run.context import RunContext, Timer
from ..run.memory import plan_for
from ..run.settings import Settings, settings_from
from ..util.blocks import block_ranges
from ..util.errors import InputError, option
from ..rng.synthetic import SHAPES, SyntheticIntegrals, synthetic_orbitals
from ..util.system_memory import peak_resident_bytes, resident_bytes
from ..util.version import __version__

STAGES = ("integrals", "metric", "transform", "whiten", "pair_energies")
MAX_REPEAT = 100  # warm passes: the record keeps each one's seconds, timings and energy
MAX_KERNEL_SIZE = 4096  # --kernel --size: the emulator runs every instruction of the call (gemm: (N/128)^3 matmuls)


def stage_gflop(nbasis, nocc, naux, occ_block, rank) -> dict:
    """GFLOP of each stage for this shape (integrals: making the synthetic tensors)."""
    nvir = nbasis - nocc
    blocks = [i1 - i0 for i0, i1 in block_ranges(nocc, occ_block)]
    pairs = sum(ni * nj for n, ni in enumerate(blocks) for nj in blocks[: n + 1])
    return {
        "integrals": (2 * naux**3 + 2 * naux * nbasis**2 * rank) / 1e9,
        "metric": naux**3 / 3 / 1e9,  # Cholesky
        "transform": (2 * naux * nbasis**2 * nocc + 2 * naux * nbasis * nocc * nvir) / 1e9,
        "whiten": nocc * nvir * naux**2 / 1e9,  # triangular solve
        "pair_energies": 2 * pairs * nvir**2 * naux / 1e9,  # (ia|jb) GEMMs
    }


def nominal_gflop(nbasis, nocc, naux) -> float:
    """The sibling libraries' count: transform, whitening and all nocc^2 pair GEMMs."""
    nvir = nbasis - nocc
    return (2 * naux * nbasis**2 * nocc + 2 * naux * nbasis * nocc * nvir
            + nocc * nvir * naux**2 + 2 * (nocc * nvir) ** 2 * naux) / 1e9


def resolve_shape(shape=None, nbasis=None, nocc=None, naux=None):
    """(nbasis, nocc, naux) from a named shape or explicit sizes; InputError if inconsistent."""
    if shape is not None:
        if any(v is not None for v in (nbasis, nocc, naux)):
            raise InputError("give either --shape or --nbasis/--nocc/--naux, not both")
        if shape not in SHAPES:
            raise InputError(f"unknown shape {shape!r} (use one of: {', '.join(SHAPES)})")
        return SHAPES[shape]
    if any(v is None for v in (nbasis, nocc, naux)):
        raise InputError("give --shape small|medium|large, or all of --nbasis, --nocc and --naux")
    if not (nbasis > 0 and naux > 0 and 0 < nocc < nbasis):
        raise InputError(f"need nbasis > nocc > 0 and naux > 0 (got {nbasis}, {nocc}, {naux})")
    return nbasis, nocc, naux


def run_bench(nbasis, nocc, naux, seed=0, repeat=3, settings: Settings | None = None, progress=None,
              integrals="host", **changes) -> dict:
    """Cold + `repeat` warm passes of the pipeline on the synthetic problem -> a JSON-able record.
    settings (keyword `changes` on top): its hardware and resource groups; progress(step, done,
    total): the callback each pass's run context reports to; integrals: where the synthetic (mn|P)
    blocks are made, "host" (uploaded block by block, as PySCF's are) or "device" (on the GPU,
    --device cuda only: the kernel layer without the upload)."""
    # warm passes are timed: kernels with a one-time load (a GPU's fused pair epilogue) are taken
    settings = settings_from(settings, **changes).replace(warm_kernels=True)
    if integrals not in ("host", "device"):
        raise InputError(f"--integrals must be host or device, got {integrals!r}")
    if not 0 <= repeat <= MAX_REPEAT:
        raise InputError(f"{option('repeat')} must be between 0 and {MAX_REPEAT}, got {repeat}")
    if not 0 <= seed < 2**64:
        raise InputError(f"--seed must be in 0 .. 2^64 - 1 (the Philox key), got {seed}")
    first = backend_for(settings, MP2_ENERGY_KERNELS)  # fail fast
    if integrals == "device" and not first.makes_integrals_on_device:
        raise InputError(f"--integrals device: only with --device cuda (on {settings.device} the synthetic "
                         "integrals are made on the host and uploaded, as PySCF's are)")
    made_on = first.device_name if integrals == "device" else HOST
    drawn_on = first.device if integrals == "device" else None  # (None: numpy blocks on the host)
    # the budget is checked before anything of the problem's size is made (what the MP2 steps' threads map
    # beyond their arrays still to come: START_UP's "scf", a run's SCF and MP2 steps)
    plan_for(first, SyntheticIntegrals(nbasis, nocc, naux, seed), [(nocc, nbasis - nocc)], settings.max_memory,
             stages=("scf",))
    coeff, energies, occupations = synthetic_orbitals(nbasis, nocc, seed)
    passes, last = [], None  # each pass's (seconds, timings, e_corr), cold first; the last pass's (result, backend)
    for n in range(repeat + 1):
        backend = first if n == 0 else backend_for(settings, MP2_ENERGY_KERNELS)
        context = RunContext(progress=progress)  # each pass its own timer
        problem = SyntheticIntegrals(nbasis, nocc, naux, seed, drawn_on)
        last = None  # (the previous pass's result and backend, with its arrays and trace, go first)
        with Timer().lap() as lap:
            result = dfmp2_energy(backend, problem, coeff, energies, occupations, settings, context=context)
        passes.append(Pass(lap.seconds, dict(result.timings), result.e_corr))
        last = (result, backend)
        del result, backend
        context.report("bench passes", n + 1, repeat + 1)
    record = bench_record((nbasis, nocc, naux, seed), problem.rank, passes, last, settings)
    record["integrals_made_on"] = made_on  # "cpu": the host, uploaded block by block
    return record


@dataclass(frozen=True)
class Pass:
    """What the record keeps of one pass: wall seconds, its step timings (s) and E_corr (Eh)."""

    seconds: float
    timings: dict
    e_corr: float


def bench_record(problem, rank, passes, last, settings) -> dict:
    """The JSON record of the passes [Pass] (cold first) on the synthetic problem (nbasis, nocc,
    naux, seed) whose (mn|P) slices have rank `rank`: per stage the warm median with its GFLOP and
    TFLOPS, what ran (last: the last pass's (result, backend)), and on a real device its measured
    GEMM rate."""
    nbasis, nocc, naux, seed = problem
    warm = passes[1:] or passes  # repeat 0: the cold pass is the timed one
    (result, backend), ran = last, last[1].record()
    flops = stage_gflop(nbasis, nocc, naux, result.plan.occ_block, rank)
    stages = {}
    for name in STAGES:
        seconds = statistics.median(p.timings.get(name, 0.0) for p in warm)
        stages[name] = {"seconds": seconds, "gflop": flops[name],
                        "tflops": flops[name] / seconds / 1e3 if seconds > 0 else None}
    record = {
        "shape": {"nbasis": nbasis, "nocc": nocc, "nvir": nbasis - nocc, "naux": naux, "seed": seed},
        "device": settings.device, "precision": ran.precision, "transform": ran.transform,
        "simulated": ran.simulated, "model_only": settings.model_only, "notes": list(ran.notes),
        "backend": ran.name, "device_description": ran.description,
        "e_corr": result.e_corr, "e_corr_os": result.e_corr_os, "e_corr_ss": result.e_corr_ss,
        # one pass: nothing to compare
        "energy_identical_across_passes": len({p.e_corr for p in passes}) == 1 if len(passes) > 1 else None,
        "stages": stages, "total_seconds": statistics.median(p.seconds for p in warm),
        "timed_passes": "warm" if len(passes) > 1 else "cold",
        "cold_seconds": passes[0].seconds, "warm_seconds": [p.seconds for p in passes[1:]],
        "gflop": sum(flops.values()), "nominal_gflop": nominal_gflop(nbasis, nocc, naux),
        "kernels": dict(result.kernels), "io": dict(result.io),
        "machine": {"cpu": _cpu(), "platform": platform.platform(), "python": platform.python_version()},
        "versions": _versions(), "commit": _commit(), "date": time.strftime("%Y-%m-%d"),
    }
    peak_device = backend.peak_memory_bytes()  # a GPU's: the passes' peak, before the GEMM rate below adds its own arrays
    peak_device_mb = peak_device / 2**20 if peak_device is not None else None
    if not ran.simulated:  # a square GEMM as large as the budget leaves room for (3 n^2 elements)
        room = max(0, result.plan.budget - resident_bytes())
        n = max(256, min(2048, int((room / (3 * backend.itemsize)) ** 0.5) // 64 * 64))
        rate = measured_gemm_tflops(backend, n)
        record.update(device_gemm_tflops=rate, device_gemm_size=n, pair_energies_fraction_of_gemm_rate=(
            stages["pair_energies"]["tflops"] / rate if stages["pair_energies"]["tflops"] else None))
    record["memory"] = memory_record(result.plan, peak_resident_bytes())  # the whole run's, GEMM rate included
    if peak_device_mb is not None:
        record["memory"]["peak_device_mb"] = peak_device_mb
    if ran.nki_api is not None:
        from ..kernels.nki.support import NEURON_SDK_OF_NKI

        record.update(nki_api=ran.nki_api, neuron_sdk=NEURON_SDK_OF_NKI.get(ran.nki_api), lnc=ran.lnc)
    if ran.simulated:
        record["kernel_specializations"] = {k: len(v) for k, v in ran.specializations.items()}
        record.update(model_record(ran.modelled, ran.modelled_seconds, "one warm pass"))
    return record


KERNELS = ("gemm", "syrk", "trsm", "potrf", "ao2mo", "spmm", "pair_energy", "rng")
# the NKI kernels each --kernel call launches (its LNC degree under nki 0.7: kernels.get_backend)
KERNEL_LAUNCHES = {"gemm": ("gemm_kernel",), "syrk": ("syrk_kernel",), "trsm": ("trsm_kernel",),
                   "potrf": ("trsm_kernel", "syrk_kernel"), "ao2mo": ("ao2mo_kernel",), "spmm": ("ao2mo_kernel",),
                   "pair_energy": ("pair_energy_kernel",), "rng": ("philox_kernel",)}
# warm per-call times a sibling library measured on trn1.2xlarge (neuronx-cc 2.24) for ITS kernels
# of these shapes, (device, kernel, size) -> ms: gemm calibrates the model (launch, host transfer); trsm is a check only
PUBLISHED_MS = {("trn1", "gemm", 512): 1.3, ("trn1", "gemm", 1024): 2.3, ("trn1", "trsm", 1024): 18.72}


def kernel_problem(kernel: str, size: int, seed: int = 0):
    """Random fp32 operands of one kernel call at `size` -> (description, call(backend)).

    gemm: N x N x N.  syrk: C [N, N] - P P^T with a 128-wide panel (one Cholesky step).
    trsm: B = X L^-T with X [N, N], L [N, N] (whitening of N rows over N auxiliary functions).
    ao2mo: 32 auxiliary functions, nao N, nocc N/8, nvir N - N/8.
    spmm: the sparse layer's block-sparse product in the MP2 transform (sparse.ao2mo): ao2mo's
    problem with (mn|P) kept on the 128-function pair blocks |M - N| <= 1 only (a chain's pattern).
    pair_energy: one block of 4 x 4 occupied pairs, nvir N, naux 3N.
    potrf: the blocked Cholesky of an N x N metric-like matrix (linalg.potrf: host fp64 diagonal
    blocks, the device's trsm and syrk; every launch of it).
    rng: N^2 Philox words of one stream (rng/nki_philox.py), brought back to the host.
    """
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)

    def f32(*shape):
        return torch.from_numpy(rng.standard_normal(shape).astype(np.float32))

    n = size
    if kernel == "gemm":
        a, b = f32(n, n), f32(n, n)
        return f"{n} x {n} x {n}", lambda backend: backend.gemm(a, b)
    if kernel == "syrk":
        c, panel = f32(n, n), f32(n, 128)
        return f"C [{n}, {n}], panel [{n}, 128]", lambda backend: backend.syrk(c, panel)
    if kernel == "trsm":
        lower = torch.from_numpy(np.tril(rng.standard_normal((n, n))).astype(np.float32)
                                 + n * torch.eye(n).numpy())
        x = f32(n, n)
        return f"X [{n}, {n}], L [{n}, {n}]", lambda backend: backend.solve_lower_transposed(lower, x)
    if kernel == "ao2mo":
        nocc = max(1, n // 8)
        ints, c_occ, c_vir = f32(32, n, n), f32(n, nocc), f32(n, n - nocc)
        ints = (ints + ints.transpose(1, 2)) / 2
        return f"nP 32, nao {n}, nocc {nocc}, nvir {n - nocc}", lambda backend: backend.ao2mo(ints, c_occ, c_vir)
    if kernel == "pair_energy":
        b_i, b_j = f32(4, n, 3 * n), f32(4, n, 3 * n)
        e_occ = -torch.rand(4, generator=torch.Generator().manual_seed(seed)) - 1.0
        e_vir = torch.rand(n, generator=torch.Generator().manual_seed(seed + 1)) + 0.5
        return (f"ni 4, nj 4, nvir {n}, naux {3 * n}",
                lambda backend: backend.pair_energy(b_i, b_j, e_occ, e_occ, e_vir))
    if kernel in ("potrf", "spmm", "rng"):
        return _layer_problem(kernel, n, rng, seed, f32)
    raise InputError(f"unknown kernel {kernel!r} (use one of: {', '.join(KERNELS)})")


def _layer_problem(kernel, n, rng, seed, f32):
    """kernel_problem for the linalg, sparse and rng layers' calls (potrf, spmm, rng)."""
    if kernel == "potrf":
        import numpy as np

        from ..linalg import potrf

        a = rng.standard_normal((n, n))
        metric = a @ a.T / n + np.eye(n)
        return f"A [{n}, {n}], 128-wide block columns", lambda backend: potrf(backend, metric)
    if kernel == "spmm":
        from ..sparse import ao2mo as screened_ao2mo, banded_pattern, random_screened

        nocc, pattern = max(1, n // 8), banded_pattern(n, 128, 1)
        screened, c_occ, c_vir = random_screened(pattern, 32, seed), f32(n, nocc), f32(n, n - nocc)
        kept = pattern.stored_elements / n**2
        return (f"nP 32, nao {n}, nocc {nocc}, nvir {n - nocc}; (mn|P) kept on 128-blocks |M - N| <= 1 "
                f"({kept:.2f} of it)", lambda backend: screened_ao2mo(backend, screened, c_occ, c_vir))
    from ..rng import nki_random_words

    return f"{n * n} Philox4x32-10 words", lambda backend: nki_random_words(backend, seed, 1, 0, n * n)


def run_kernel_bench(kernel: str, size: int, device: str = "trn1", simulate: bool = False,
                     nki_api=None, seed: int = 0) -> dict:
    """MODEL of one warm kernel call on Trainium (trn1, trn2, trn3) from its emulator trace -> a
    JSON-able record."""
    if not runs_nki(device) or not simulate:
        raise InputError(f"--kernel models an NKI kernel call: use --device {'|'.join(TRAINIUM)} --simulate")
    if not 1 <= size <= MAX_KERNEL_SIZE:
        raise InputError(f"{option('size')} must be between 1 and {MAX_KERNEL_SIZE} (the emulator runs every "
                         f"instruction of the call), got {size}")
    import torch

    description, call = kernel_problem(kernel, size, seed)
    backend = get_backend(device, "fp32", simulate=True, nki_api=nki_api, kernels=KERNEL_LAUNCHES[kernel])
    out = call(backend)
    if isinstance(out, torch.Tensor):  # the result comes back to the host, as in the calibration runs
        backend.to_host(out)
    ran = backend.record()
    modelled = ran.modelled
    published = PUBLISHED_MS.get((device, kernel, size))
    record = {
        "kernel": kernel, "size": size, "shape": description, "device": device,
        "nki_api": ran.nki_api, "lnc": ran.lnc, "launches": ran.trace["launches"],
        "modelled": modelled[device], "modelled_note": MODEL_NOTE + "; warm calls, no compile",
        "calls": ran.calls, "trace": ran.trace,
        "versions": _versions(), "commit": _commit(), "date": time.strftime("%Y-%m-%d"),
    }
    if published is not None:
        record[f"published_{device}_ms"] = published
        record["model_over_published"] = modelled[device]["seconds"] * 1e3 / published
    return record


def measured_gemm_tflops(backend, n: int = 2048, repeat: int = 5) -> float:
    """This device's square-GEMM rate in the run's precision (median of `repeat`, after warm-up)."""
    import torch

    a = torch.full((n, n), 1.0 / n, dtype=backend.compute_dtype, device=backend.device)
    times, timer = [], Timer(synchronize=backend.synchronize)
    for _ in range(repeat + 1):
        backend.synchronize()
        with timer.lap() as lap:
            torch.matmul(a, a)
        times.append(lap.seconds)
    return 2 * n**3 / statistics.median(times[1:]) / 1e12


def _cpu():
    from ..kernels.torch.backend import cpu_description

    return cpu_description()


def _versions():
    from ..util.files import package_versions

    return {"dfmp2": __version__, **package_versions(("torch", "numpy", "pyscf"))}


def _commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__)), check=True,
                              timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"
