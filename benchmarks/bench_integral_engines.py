"""Three-center integrals (mn|P) on an NVIDIA GPU, two engines side by side, in one process:

  host        dfmp2's path today: `chem.MNPIntegrals.block(p0, p1)` (PySCF's libcint on the
              host's cores, s2ij, unpacked to [nP, nao, nao]) over the plan's auxiliary blocks, each
              uploaded by the torch backend's `to_device(block, fp64=True)` (host blocks of 16 MiB
              or more through the two pinned 32 MiB staging buffers); integrals and upload timed
              apart (the GPU synchronized after each upload).
  gpu4pyscf   gpu4pyscf's block-divergent 3c2e kernels (`gpu4pyscf.df.int3c2e_bdiv`, Apache-2.0,
              pinned to 1.9.0), made on the GPU and handed to torch through DLPack (no host copy):
    evaluator  Int3c2eOpt(mol, auxmol).build(); int3c2e_evaluator(reorder_aux=True, cart=mol.cart)
               -> compressed j3c [AO pair (gpu4pyscf's sorted shells), aux (sorted, Cartesian)];
               the aux side taken to PySCF's spherical order by the sorted auxmol's ctr_coeff (one
               GEMM), the pairs scattered by pair_and_diag_indices(original_ao_order=True) straight
               into dfmp2's layout [naux, nao, nao]
    aux_e2     the module's one public function, aux_e2(mol, auxmol) -> cupy [nao, nao, naux] in
               PySCF's order; torch.from_dlpack, then .permute(2, 0, 1).contiguous() (timed apart)
    df         gpu4pyscf.df.DF(mol).build() with dfmp2's auxmol: the SCF's whitened factor
               B = L^-1 (mn|P) over its kept pairs (its own decontracted-and-recontracted path),
               checked against L^-1 of the evaluator's tensor, L = chol((P|Q)) of dfmp2's metric
  Each gpu4pyscf variant runs cold (the first call, set-up and any one-time load or JIT compile
  included) then --repeat times warm.

Correctness: every host block is compared on the GPU with the gpu4pyscf tensor (max |difference|
over the whole tensor); they must agree to --tol (1e-10 Hartree) or the record says they do not.
Same molecule, same auxiliary set (dfmp2's MP2 fitting set, `chem.fitting_basis(mol, mp2fit=True)`).

    python benchmarks/bench_integral_engines.py --json out.json
    python benchmarks/bench_integral_engines.py --cases examples/water.xyz:cc-pvdz --device cpu --engines host

No fallback: a gpu4pyscf variant asked for and not importable ends the run with exit status 2 and
a record that says so. Exit status 1: a molecule failed (its error is in the record, the others
still run); 4: some comparison disagreed. The JSON is rewritten after every molecule.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from harness import machine  # noqa: E402

DEFAULT_CASES = ("examples/benzene.xyz:cc-pvtz", "examples/naphthalene.xyz:cc-pvtz", "examples/water16.xyz:cc-pvtz")
G4P_VARIANTS = ("evaluator", "aux_e2", "df")
ENGINES = ("host",) + G4P_VARIANTS
GPU4PYSCF_PINNED = "1.9.0"
LIBCINT_LICENCE = "BSD-2-Clause (libcint upstream; bundled in PySCF's wheel as lib/deps/lib/libcint.so)"


class Steps:
    """Wall seconds of consecutive named steps, the device synchronized at each mark."""

    def __init__(self, sync):
        self.sync, self.seconds = sync, {}
        sync()
        self.last = self.first = time.perf_counter()

    def __call__(self, name):
        self.sync()
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self.last
        self.last = now

    def record(self):
        return {**{k: round(v, 6) for k, v in self.seconds.items()}, "total": round(self.last - self.first, 6)}


def make_sync(device):
    if device != "cuda":
        return lambda: None
    import torch

    def sync():
        torch.cuda.synchronize()
        if "cupy" in sys.modules:
            sys.modules["cupy"].cuda.Device().synchronize()
    return sync


def to_torch(array):
    """A cupy (or any DLPack) array as a torch tensor on the same device, sharing its memory: the
    DLPack protocol, or cupy's older toDlpack() capsule where torch and cupy disagree on the
    protocol's version (still no copy, never through the host)."""
    import torch

    try:
        return torch.from_dlpack(array)
    except (TypeError, BufferError, RuntimeError):
        if not hasattr(array, "toDlpack"):
            raise
        return torch.utils.dlpack.from_dlpack(array.toDlpack())


def free_device_memory():
    if "cupy" in sys.modules:
        sys.modules["cupy"].get_default_memory_pool().free_all_blocks()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---- the engines -------------------------------------------------------------------------------
def host_path(integrals, backend, aux_block, sync, references):
    """dfmp2's (mn|P) blocks made on the host and uploaded; each uploaded block is compared
    (untimed) with its rows of every tensor in `references` ({name: torch [naux, nao, nao] on
    the device}): max |difference| per name."""
    from dfmp2.util.system_memory import release_freed_memory

    blocks = integrals.aux_blocks(aux_block)
    made = uploaded = 0.0
    nbytes, max_diff = 0, dict.fromkeys(references, 0.0)
    for p0, p1 in blocks:
        start = time.perf_counter()
        block = integrals.block(p0, p1)
        made += time.perf_counter() - start
        sync()
        start = time.perf_counter()
        on_device = backend.to_device(block, fp64=True)
        sync()
        uploaded += time.perf_counter() - start
        nbytes += block.nbytes
        for name, reference in references.items():
            max_diff[name] = max(max_diff[name], float((on_device - reference[p0:p1]).abs().max()))
        del block, on_device
        release_freed_memory()
    return {"integrals_seconds": round(made, 6), "upload_seconds": round(uploaded, 6),
            "total_seconds": round(made + uploaded, 6), "blocks": len(blocks), "aux_block": aux_block,
            "bytes_uploaded": nbytes, "upload_gb_per_s": round(nbytes / uploaded / 1e9, 3) if uploaded > 0 else None,
            "made_on": "host (PySCF libcint, OpenMP)", "max_abs_diff": max_diff}


def g4p_evaluator(mol, auxmol, sync):
    """gpu4pyscf 1.9.0's evaluator, taken to dfmp2's [naux, nao, nao] in PySCF's AO and aux order."""
    import cupy as cp
    from gpu4pyscf.df import int3c2e_bdiv

    steps = Steps(sync)
    opt = int3c2e_bdiv.Int3c2eOpt(mol, auxmol).build()  # sorts shells by (l, nprim), splits general contractions
    steps("setup_opt")
    eval_j3c, aux_sorting = opt.int3c2e_evaluator(reorder_aux=True, cart=mol.cart)[:2]
    pair_address = opt.pair_and_diag_indices(cart=mol.cart)[0]  # m * nao + n in PySCF's order, one of (m, n)/(n, m)
    coef = opt.aux_coeff  # sorted Cartesian aux -> PySCF's aux functions [naux_cart, naux]
    aux_coef = cp.empty_like(coef)
    aux_coef[aux_sorting] = coef  # the evaluator's column order (reorder_aux) -> ctr_coeff's rows, as aux_e2 does
    nao, naux = mol.nao_nr(), auxmol.nao_nr()
    rows, cols = divmod(pair_address, nao)
    steps("setup_maps")
    j3c = eval_j3c()  # [npair, naux_cart], fp64
    steps("integrals")
    shape = {"npair": int(j3c.shape[0]), "naux_cart": int(j3c.shape[1]), "bytes_compressed": int(j3c.nbytes)}
    transformed = cp.dot(aux_coef.T, j3c.T)  # [naux, npair]
    del j3c
    steps("aux_transform")
    out = cp.zeros((naux, nao * nao))
    out[:, cols * nao + rows] = transformed
    out[:, rows * nao + cols] = transformed
    del transformed
    steps("scatter")
    tensor = to_torch(out.reshape(naux, nao, nao))  # no copy: torch holds cupy's memory
    steps("dlpack")
    return tensor, steps.record(), shape


def g4p_aux_e2(mol, auxmol, sync):
    """gpu4pyscf 1.9.0's public aux_e2 -> [nao, nao, naux]; DLPack; permuted to [naux, nao, nao]."""
    from gpu4pyscf.df import int3c2e_bdiv

    steps = Steps(sync)
    full = int3c2e_bdiv.aux_e2(mol, auxmol)
    steps("aux_e2")
    view = to_torch(full)
    steps("dlpack")
    tensor = view.permute(2, 0, 1).contiguous()
    del view, full
    steps("layout")
    return tensor, steps.record(), {}


def g4p_df(mol, integrals, sync):
    """gpu4pyscf 1.9.0's DF.build() on dfmp2's auxmol: the whitened factor over its kept pairs."""
    from gpu4pyscf.df import DF

    steps = Steps(sync)
    dfobj = DF(mol, auxbasis=integrals.fitting.basis)
    dfobj.auxmol = integrals.auxmol  # the very auxmol dfmp2 uses (build() keeps a set auxmol)
    dfobj.use_gpu_memory = True  # cderi on the GPU or a MemoryError, never the host
    dfobj.build()
    steps("build")
    cderi, (addresses, _diag) = dfobj._cderi[0], dfobj._cderi_idx
    return (cderi, addresses, dfobj), steps.record(), {"cderi_shape": list(cderi.shape),
                                                      "bytes_cderi": int(cderi.nbytes)}


def check_df(df_out, reference, metric, tol_b):
    """max |B_gpu4pyscf - L^-1 (mn|P)| over gpu4pyscf's pairs, (mn|P) = reference (the device tensor)."""
    import torch

    cderi, addresses, _ = df_out
    naux, nao = reference.shape[0], reference.shape[1]
    b = to_torch(cderi)
    if b.shape[0] != naux:
        return {"agree": False, "note": f"cderi has {b.shape[0]} rows, naux {naux}: gpu4pyscf dropped linearly "
                                        "dependent aux vectors (eigh path), not comparable with the Cholesky factor"}
    index = to_torch(addresses).long()
    lower = torch.linalg.cholesky(torch.as_tensor(metric, device=reference.device))
    fitted = torch.linalg.solve_triangular(lower, reference.reshape(naux, nao * nao)[:, index], upper=False)
    diff, scale = float((fitted - b).abs().max()), float(fitted.abs().max())
    del fitted, index, lower, b
    return {"max_abs_diff": diff, "max_abs_value": scale, "tolerance": tol_b, "agree": diff <= tol_b,
            "pairs": int(addresses.shape[0])}


# ---- the record ------------------------------------------------------------------------------------
def gpu4pyscf_available():
    """(modules, None) or (None, the reason); imports timed."""
    start = time.perf_counter()
    try:
        import cupy  # noqa: F401
        import gpu4pyscf
        from gpu4pyscf.df import int3c2e_bdiv  # noqa: F401
    except Exception as error:  # noqa: BLE001 - any import failure: the stubbed libxc, no cupy, no GPU driver
        return None, f"{type(error).__name__}: {error}"
    return {"version": gpu4pyscf.__version__, "import_seconds": round(time.perf_counter() - start, 3)}, None


def distribution_licence(prefix, exact=False):
    """{name, version, License metadata, the LICENSE file's first non-blank line} of the installed
    distribution named `prefix` (exact) or whose name starts with it (None if none)."""
    for dist in importlib.metadata.distributions():
        name = (dist.metadata.get("Name") or "").lower().replace("_", "-")
        if name != prefix if exact else not name.startswith(prefix):
            continue
        first = None
        for f in dist.files or ():
            if os.path.basename(str(f)).upper() in ("LICENSE", "LICENSE.TXT", "COPYING"):
                try:
                    text = f.read_text()
                    first = next((line.strip() for line in text.splitlines() if line.strip()), None)
                except (OSError, UnicodeDecodeError):
                    pass
                break
        return {"distribution": name, "version": dist.version, "license": dist.metadata.get("License"),
                "license_expression": dist.metadata.get("License-Expression"), "license_file_first_line": first}
    return None


def environment(device):
    import numpy
    import torch

    import dfmp2

    record = {"python": platform.python_version(), "numpy": numpy.__version__, "torch": torch.__version__,
              "torch_cuda": torch.version.cuda, "dfmp2": getattr(dfmp2, "__version__", None)}
    try:
        import pyscf
        from pyscf import lib

        record["pyscf"], record["pyscf_threads"] = pyscf.__version__, lib.num_threads()
    except ImportError:
        pass
    if "cupy" in sys.modules:
        cupy = sys.modules["cupy"]
        record["cupy"] = cupy.__version__
        record["cupy_cuda_runtime"] = cupy.cuda.runtime.runtimeGetVersion()
        record["cupy_cuda_driver_api"] = cupy.cuda.runtime.driverGetVersion()
    if "gpu4pyscf" in sys.modules:
        record["gpu4pyscf"] = sys.modules["gpu4pyscf"].__version__
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        record["gpu"] = {"name": props.name, "memory_gb": round(props.total_memory / 1e9, 1),
                         "compute_capability": f"{props.major}.{props.minor}"}
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20, check=True).stdout.strip()
            record["gpu"]["nvidia_smi"] = out.splitlines()[0] if out else None
            record["gpu"]["driver"] = out.splitlines()[0].split(",")[-1].strip() if out else None
        except (OSError, subprocess.SubprocessError, IndexError):
            record["gpu"]["driver"] = None
    for key in ("OMP_NUM_THREADS", "PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE", "CUPY_CACHE_DIR"):
        record[key] = os.environ.get(key)
    cache = os.environ.get("CUPY_CACHE_DIR") or os.path.expanduser("~/.cupy/kernel_cache")
    record["cupy_kernel_cache_files_at_start"] = len(os.listdir(cache)) if os.path.isdir(cache) else 0
    return record


def commit():
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=ROOT, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=ROOT, timeout=10, check=False).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def write(path, report):
    if not path:
        return
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=1)
    os.replace(tmp, path)


def best(runs):
    return min(r["total"] for r in runs) if runs else None


# ---- one molecule ----------------------------------------------------------------------------------
def one_case(case, args, backend, sync, engines, first_call):
    import torch

    from dfmp2 import chem
    from dfmp2.run.memory import MIN_AUX_BLOCK

    path, _, basis = case.partition(":")
    basis = basis or "cc-pvdz"
    entry = {"molecule": path, "basis": basis}
    mol = chem.build_molecule(chem.read_xyz(path), basis)
    integrals = chem.MNPIntegrals(mol)  # dfmp2's provider and its MP2 fitting set
    nao, naux = mol.nao_nr(), integrals.naux
    hints = backend.plan_hints(nvir=max(1, nao - mol.nelectron // 2), naux=naux)
    aux_block = args.aux_block or (naux if not hints.aux_block_bytes else min(
        naux, max(integrals.largest_shell(), MIN_AUX_BLOCK, hints.aux_block_bytes // (8 * nao * nao))))
    entry.update({"auxbasis": integrals.auxbasis, "nbf": nao, "naux": naux, "naux_cart": integrals.auxmol.nao_cart(),
                  "natm": mol.natm, "cartesian": bool(mol.cart), "bytes_full": nao * nao * naux * 8})
    references, timings = {}, {}  # {variant: its tensor}: the first always, the second where memory allows
    if args.device == "cuda":
        entry["gpu_memory_free_gb_at_start"] = round(torch.cuda.mem_get_info()[0] / 1e9, 1)
    for variant in ("evaluator", "aux_e2"):
        if variant not in engines:
            continue
        run = g4p_evaluator if variant == "evaluator" else g4p_aux_e2
        record = entry["gpu4pyscf_" + variant] = {
            "engine": f"gpu4pyscf {sys.modules['gpu4pyscf'].__version__} int3c2e_bdiv "
                      f"({'Int3c2eOpt.int3c2e_evaluator' if variant == 'evaluator' else 'aux_e2'}), on the GPU",
            "first_call_in_process": first_call[variant]}
        try:  # one variant's failure does not lose the others
            first_call[variant] = False
            tensor, record["cold"], shape = run(mol, integrals.auxmol, sync)
            record.update(shape)
            record["layout"] = f"torch {tuple(tensor.shape)} {tensor.dtype} on {tensor.device}, from cupy by DLPack"
            for name, other in references.items():
                record["max_abs_diff_vs_" + name] = float((tensor - other).abs().max())
            free = torch.cuda.mem_get_info()[0] if tensor.is_cuda else float("inf")
            if not references or free > 6 * entry["bytes_full"]:
                references[variant] = tensor
            del tensor
            free_device_memory()
            record["warm"] = []
            for _ in range(args.repeat):
                warm, step_times, _ = run(mol, integrals.auxmol, sync)
                record["warm"].append(step_times)
                del warm
                free_device_memory()
            record["warm_best_seconds"] = best(record["warm"])
            timings[variant] = record
        except Exception:  # noqa: BLE001 - recorded, the other engines go on
            record["error"] = traceback.format_exc()
            free_device_memory()
    if "host" in engines:
        entry["host"] = host_path(integrals, backend, aux_block, sync, references)
        if references:
            diffs = entry["host"]["max_abs_diff"]
            entry["comparison"] = {
                "what": "max |(mn|P)_host - (mn|P)_gpu4pyscf| over every block, on the GPU, per gpu4pyscf variant",
                "max_abs_diff": {"gpu4pyscf_" + k: v for k, v in diffs.items()},
                "max_abs_value": float(next(iter(references.values())).abs().max()), "tolerance": args.tol,
                "agree": all(v <= args.tol for v in diffs.values())}
    reference = references.get("evaluator", references.get("aux_e2"))
    references.clear()
    free_device_memory()
    if "df" in engines:
        record = entry["gpu4pyscf_df"] = {
            "engine": f"gpu4pyscf {sys.modules['gpu4pyscf'].__version__} df.DF.build (whitened cderi, "
                      "compressed pairs), on the GPU", "first_call_in_process": first_call["df"]}
        try:
            first_call["df"] = False
            out, record["cold"], shape = g4p_df(mol, integrals, sync)
            record.update(shape)
            if reference is not None:
                record["check_vs_whitened_reference"] = check_df(out, reference, integrals.metric(), args.tol_b)
            del out
            free_device_memory()
            record["warm"] = []
            for _ in range(args.repeat):
                out, step_times, _ = g4p_df(mol, integrals, sync)
                record["warm"].append(step_times)
                del out
                free_device_memory()
            record["warm_best_seconds"] = best(record["warm"])
        except Exception:  # noqa: BLE001 - recorded, the other engines go on
            record["error"] = traceback.format_exc()
            free_device_memory()
    if "host" in entry:
        host_total = entry["host"]["total_seconds"]
        entry["host_over_gpu4pyscf"] = {
            variant: round(host_total / timings[variant]["warm_best_seconds"], 2)
            for variant in timings if timings[variant].get("warm_best_seconds")}
    del reference
    free_device_memory()
    return entry


def summary_line(entry):
    parts = [f"{os.path.basename(entry['molecule'])} {entry['basis']} nbf {entry.get('nbf')} naux {entry.get('naux')}"]
    if "error" in entry:
        return parts[0] + f" | FAILED: {entry['error'].strip().splitlines()[-1]}"
    if "host" in entry:
        h = entry["host"]
        parts.append(f"host ints {h['integrals_seconds']:.3f} s upload {h['upload_seconds']:.3f} s "
                     f"({h['blocks']} blocks)")
    for variant in G4P_VARIANTS:
        r = entry.get("gpu4pyscf_" + variant)
        if r and "error" in r:
            parts.append(f"g4p {variant} FAILED: {r['error'].strip().splitlines()[-1]}")
        elif r and "cold" in r:
            warm = f"{r['warm_best_seconds']:.3f}" if r["warm_best_seconds"] is not None else "-"
            parts.append(f"g4p {variant} cold {r['cold']['total']:.3f} s warm {warm} s")
    if "comparison" in entry:
        c = entry["comparison"]
        parts.append(f"max|diff| {max(c['max_abs_diff'].values()):.2e} ({'agree' if c['agree'] else 'DISAGREE'})")
    check = entry.get("gpu4pyscf_df", {}).get("check_vs_whitened_reference")
    if check:
        parts.append(f"B max|diff| {check.get('max_abs_diff', float('nan')):.2e} "
                     f"({'agree' if check['agree'] else 'DISAGREE'})")
    return " | ".join(parts)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=list(DEFAULT_CASES), help="XYZ[:BASIS] (basis default cc-pvdz)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cpu: the host path only, to try the script without a GPU")
    parser.add_argument("--engines", default=",".join(ENGINES), help=f"of {', '.join(ENGINES)}")
    parser.add_argument("--repeat", type=int, default=2, help="warm calls of each gpu4pyscf variant")
    parser.add_argument("--aux-block", type=int, default=0,
                        help="aux functions per host block (0: what dfmp2's plan prefers on the device)")
    parser.add_argument("--tol", type=float, default=1e-10, help="max |difference| of (mn|P) to call them equal")
    parser.add_argument("--tol-b", type=float, default=1e-8, help="the same for the whitened factor B")
    parser.add_argument("--json", default="integral_engines.json", help="the record (rewritten after each molecule)")
    args = parser.parse_args(argv)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = sorted(set(engines) - set(ENGINES))
    if unknown:
        parser.error(f"unknown engines {unknown}; choose from {', '.join(ENGINES)}")
    started = time.perf_counter()
    report = {"benchmark": "integral_engines", "script": "benchmarks/bench_integral_engines.py",
              "argv": sys.argv[1:] if argv is None else list(argv), "commit": commit(),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "device": args.device, "engines_requested": engines, "machine": machine(), "molecules": [],
              "finished": False}
    import torch  # noqa: F401 (before cupy: torch's CUDA libraries are the ones loaded first)

    wants_g4p = [e for e in engines if e in G4P_VARIANTS]
    if wants_g4p:
        available, reason = gpu4pyscf_available()
        if available is None or args.device != "cuda":
            why = reason or "gpu4pyscf's kernels need --device cuda"
            report["error"] = (f"gpu4pyscf engine(s) {', '.join(wants_g4p)} requested but not usable: {why}. "
                               "Nothing was timed; the host path is not run in their place "
                               "(give --engines host for the host path alone).")
            write(args.json, report)
            print(report["error"], file=sys.stderr)
            return 2
        if available["version"] != GPU4PYSCF_PINNED:
            report["gpu4pyscf_version_warning"] = (f"gpu4pyscf {available['version']} is not the pinned "
                                                   f"{GPU4PYSCF_PINNED}: its int3c2e_bdiv API changed in 2026-08")
        report["gpu4pyscf_import_seconds"] = available["import_seconds"]

    from dfmp2.kernels import get_backend

    try:
        backend = get_backend(args.device, "fp64")  # no GPU with --device cuda: an error, never the CPU instead
    except Exception as error:  # noqa: BLE001 - dfmp2's ComputationError, recorded
        report["error"] = f"{type(error).__name__}: {error}"
        write(args.json, report)
        print(report["error"], file=sys.stderr)
        return 2
    sync = make_sync(args.device)
    report["environment"] = environment(args.device)
    report["backend"] = backend.describe()
    report["licences"] = {"host": {"pyscf": distribution_licence("pyscf", exact=True), "libcint": LIBCINT_LICENCE}}
    if wants_g4p:
        report["licences"]["gpu4pyscf"] = distribution_licence("gpu4pyscf-cuda")
        report["licences"]["cupy"] = distribution_licence("cupy-cuda")
        report["gpu4pyscf_api"] = {
            "module": "gpu4pyscf.df.int3c2e_bdiv (1.9.0)",
            "evaluator": "Int3c2eOpt(mol, auxmol).build(); int3c2e_evaluator(reorder_aux=True, cart=mol.cart)[:2] "
                         "-> (eval_j3c, aux_sorting); eval_j3c() -> cupy [npair, naux_cart]; "
                         "pair_and_diag_indices(cart=mol.cart)[0] -> m*nao+n (original_ao_order=True); "
                         "aux_coeff (SortedMole.ctr_coeff) with rows permuted by aux_sorting",
            "aux_e2": "aux_e2(mol, auxmol) -> cupy [nao, nao, naux], PySCF order (the module's __all__)",
            "df": "gpu4pyscf.df.DF(mol, auxbasis); .auxmol = dfmp2's; .use_gpu_memory = True; .build(); "
                  "._cderi[0] cupy [naux, npair], ._cderi_idx[0] pair addresses m*nao+n"}
    first_call = {v: True for v in G4P_VARIANTS}
    failed = disagreed = False
    for case in args.cases:
        start = time.perf_counter()
        try:
            entry = one_case(case, args, backend, sync, engines, first_call)
        except Exception:  # noqa: BLE001 - one molecule's failure (memory, basis, kernel) does not lose the others
            path, _, basis = case.partition(":")
            entry = {"molecule": path, "basis": basis or "cc-pvdz", "error": traceback.format_exc()}
            failed = True
            free_device_memory()
        entry["wall_seconds"] = round(time.perf_counter() - start, 3)
        failed |= any("error" in entry.get("gpu4pyscf_" + v, {}) for v in G4P_VARIANTS)
        checks = [entry.get("comparison"), entry.get("gpu4pyscf_df", {}).get("check_vs_whitened_reference")]
        disagreed |= any(c is not None and not c["agree"] for c in checks)
        report["molecules"].append(entry)
        report["wall_seconds"] = round(time.perf_counter() - started, 3)
        write(args.json, report)
        print(summary_line(entry), flush=True)
    report["finished"] = True
    report["all_agree"] = not disagreed
    report["wall_seconds"] = round(time.perf_counter() - started, 3)
    write(args.json, report)
    return 1 if failed else 4 if disagreed else 0


if __name__ == "__main__":
    sys.exit(main())
