"""The sparse layer on Trainium, dense against block-sparse, on the issue's series (linear alkanes
CnH(2n+2) and water clusters (H2O)n in cc-pVDZ, cc-pVDZ-RI): the MP2 AO->MO transform as
ao2mo_kernel runs it, on dfmp2's NKI emulator with the calibrated cost MODEL (not a measurement).

Per molecule: the screening pattern at 1e-10 and the 128 x 128 tiles its kept blocks overlap;
one auxiliary block of the run's plan (the NKI backend's block size) of real (mn|P), transformed
dense (`ao2mo`) and block-sparse (`screened_ao2mo`) with each transform (fp32, exact) and the molecule's
occupied count (no frozen core, orthonormal orbitals), each emulated once per target (trn1,
trn2, trn3); the run's figures are that block's times the plan's block count (every block is padded
to the same launch). Reported per target: upload bytes, modelled upload and kernel seconds,
Tensor Engine FLOPs issued, dense / block-sparse ratios; the two outputs' largest difference;
and the host's packing and slicing seconds per block (measured on this machine). A launch the
NeuronCore cannot hold (the exact transform keeps its orbital slices in SBUF: issue 27) is
recorded with the emulator's error.

    python benchmarks/bench_sparse_trainium.py --alkanes 10 20 40 60 --waters 8 16 32 64 \\
        --json benchmarks/results/sparse_trainium_model.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from types import SimpleNamespace

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from bench_sparse import molecule  # noqa: E402

TARGETS = ("trn1", "trn2", "trn3")


def model_block(target, transform, block, c, nocc, screened):
    """One emulated transform launch of `block` on `target` (model-only backend, `transform`
    exact or fp32): its modelled figures and the output."""
    from dfmp2.kernels import get_backend

    backend = get_backend(target, simulate=True, model_only=True, transform=transform)
    backend.prepare(SimpleNamespace(aux_block=block.naux if screened else block.shape[0]))
    c_occ, c_vir = (backend.to_device(x, fp64=True) for x in (c[:, :nocc], c[:, nocc:]))
    start = time.perf_counter()
    if screened:
        out = backend.screened_ao2mo(block, c_occ, c_vir)
    else:
        out = backend.ao2mo(backend.to_device(block, fp64=True), c_occ, c_vir)
    wall = time.perf_counter() - start
    step = backend.modelled()[target]["seconds_by_step"]["ao2mo_kernel"]
    trace = backend.trace.as_dict()
    return {"model_seconds": step["seconds"], "model_upload_seconds": step["upload_seconds"],
            "upload_mb": trace["host_mb_in"], "matmuls": trace["matmuls"], "matmul_gflop": trace["matmul_gflop"],
            "emulator_wall_seconds": round(wall, 2)}, backend.to_host(out)


def host_seconds(dense_block, screened_block, tiles):
    """Measured host seconds per block: exact-transform packing and slicing of the dense block's
    lower tiles, against packing the kept lower tiles and slicing them."""
    from dfmp2.kernels.nki.sparse import TileMap, pack_dense_tiles, pack_tiles, symmetric_digits
    from dfmp2.kernels.nki.ozaki import X_DIGITS

    nao = dense_block.shape[1]
    start = time.perf_counter()
    symmetric_digits(pack_dense_tiles(dense_block, TileMap.full(nao).lower()), nao, X_DIGITS)
    dense = time.perf_counter() - start
    start = time.perf_counter()
    packed = pack_tiles(screened_block, tiles.lower())
    pack = time.perf_counter() - start
    symmetric_digits(packed, nao, X_DIGITS)
    return {"dense_slice": round(dense, 3), "sparse_pack": round(pack, 3),
            "sparse_slice": round(time.perf_counter() - start - pack, 3)}


def compare(target, transform, dense_block, screened_block, c, nocc, nblocks):
    """Dense against block-sparse on one target and transform: per block, per run (nblocks
    launches), ratios; or why the launch does not fit the NeuronCore (the emulator's error)."""
    from nki_emulator.core import NkiConstraintError

    try:
        dense, x_dense = model_block(target, transform, dense_block, c, nocc, False)
        sparse, x_sparse = model_block(target, transform, screened_block, c, nocc, True)
    except NkiConstraintError as error:
        return {"does_not_fit": str(error).splitlines()[0]}
    per_run = {mode: {"upload_mb": fig["upload_mb"] * nblocks,
                      "model_upload_seconds": fig["model_upload_seconds"] * nblocks,
                      "model_seconds": fig["model_seconds"] * nblocks,
                      "matmul_gflop": fig["matmul_gflop"] * nblocks} for mode, fig in
               (("dense", dense), ("block_sparse", sparse))}
    return {"per_block": {"dense": dense, "block_sparse": sparse}, "per_run": per_run,
            "ratio_dense_over_sparse": {k: per_run["dense"][k] / per_run["block_sparse"][k]
                                        for k in ("upload_mb", "model_seconds", "matmul_gflop")},
            "largest_output_difference": float(np.abs(x_dense - x_sparse).max()),
            "largest_output": float(np.abs(x_dense).max())}


def run_molecule(kind, n, basis, transforms):
    from dfmp2 import chem
    from dfmp2.kernels import get_backend
    from dfmp2.kernels.nki.sparse import TileMap
    from dfmp2.run.memory import plan_for
    from dfmp2.sparse import SCREENING_DEFAULT, screen_integrals

    mol = molecule(kind, n, basis)
    nocc = mol.nelectron // 2
    integrals = chem.MNPIntegrals(mol, None)
    nao, naux = integrals.nao, integrals.naux
    plan = plan_for(get_backend("trn2", simulate=True), integrals, [(nocc, nao - nocc)], 20000)
    blocks = integrals.aux_blocks(plan.aux_block)
    p0, p1 = blocks[0]
    dense_block = integrals.block(p0, p1)
    record = screen_integrals(str(SCREENING_DEFAULT), integrals, {"mp2"}, "nki")
    screened_block = integrals.block(p0, p1)
    tiles = TileMap.from_pattern(integrals.screening)
    c = np.linalg.qr(np.random.default_rng(7).standard_normal((nao, nao)))[0]
    out = {"molecule": f"{'C%dH%d' % (n, 2 * n + 2) if kind == 'alkane' else '(H2O)%d' % n}", "nbasis": nao,
           "naux": naux, "nocc": nocc, "aux_block": plan.aux_block, "launch_aux": p1 - p0, "blocks": len(blocks),
           "kept_fraction": record["kept_fraction"], "tiles": tiles.record(),
           "host_seconds_per_block": host_seconds(dense_block, screened_block, tiles)}
    for transform in transforms:
        for target in TARGETS:
            out[f"{target}_{transform}"] = compare(target, transform, dense_block, screened_block, c, nocc, len(blocks))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alkanes", type=int, nargs="*", default=[10, 20])
    parser.add_argument("--waters", type=int, nargs="*", default=[8, 16])
    parser.add_argument("--basis", default="cc-pvdz")
    parser.add_argument("--transforms", nargs="*", default=["fp32", "exact"])
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    results = []
    for kind, sizes in (("alkane", args.alkanes), ("water", args.waters)):
        for n in sizes:
            r = run_molecule(kind, n, args.basis, args.transforms)
            results.append(r)
            for transform in args.transforms:
                t2 = r[f"trn2_{transform}"]
                if "does_not_fit" in t2:
                    print(f"{r['molecule']:10s} trn2 {transform}: {t2['does_not_fit']}", flush=True)
                    continue
                print(f"{r['molecule']:10s} nbasis {r['nbasis']:5d} tiles kept {r['tiles']['kept_fraction']:.2f} | "
                      f"trn2 {transform} MODEL dense {t2['per_run']['dense']['model_seconds']:.3f} s, block-sparse "
                      f"{t2['per_run']['block_sparse']['model_seconds']:.3f} s "
                      f"(x{t2['ratio_dense_over_sparse']['model_seconds']:.2f}); upload "
                      f"{t2['per_run']['dense']['upload_mb']:.0f} -> {t2['per_run']['block_sparse']['upload_mb']:.0f} MB",
                      flush=True)
        if args.json:  # after each molecule: a long series keeps what it has
            with open(args.json, "w") as handle:
                json.dump({"note": "calibrated MODEL of the NKI transform (not a measurement); emulator on the host",
                           "results": results}, handle, indent=1)
    alkanes = [r for r in results if r["molecule"].startswith("C")]
    fits = {}
    for key in (k for k in (alkanes[0] if alkanes else {}) if k.startswith("trn")):
        for mode in ("dense", "block_sparse"):
            points = [(r["nbasis"], r[key]["per_run"][mode]["model_seconds"]) for r in alkanes if "per_run" in r[key]]
            if len(points) >= 2:
                fits[f"{key}_{mode}"] = round(float(np.polyfit(*np.log(np.array(points)).T, 1)[0]), 3)
    print("fitted exponents (alkanes, MODEL):", fits)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"note": "calibrated MODEL of the NKI transform (not a measurement); emulator on the host",
                       "results": results, "alkane_exponents": fits}, handle, indent=1)

if __name__ == "__main__":
    main()
