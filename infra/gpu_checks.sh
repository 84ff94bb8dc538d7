#!/usr/bin/env bash
# The CUDA checks of a GPU host, in stages that fit short lease calls (docs/gpu.md):
#
#   infra/gpu_checks.sh STAGE OUTDIR [COMMIT]
#     tests      python -m pytest -m cuda (log: OUTDIR/pytest.txt)
#     refs       benchmarks/reference_runs.py: 4 molecules x cc-pVDZ/cc-pVTZ in fp64 and fp32
#                (OUTDIR/reference_cuda.json)
#     bench      dfmp2 bench --shape small|medium|large --device cuda in each precision (OUTDIR/bench_*.json)
#     epilogue   benchmarks/bench_cuda_pair_epilogue.py: the fused pair epilogue against torch ops,
#                medium fp32 and large fp64, integrals on the GPU (OUTDIR/pair_epilogue.json)
#     gpu4pyscf  benchmarks/bench_gpu4pyscf.py on benzene/cc-pVTZ (with PySCF on the host's cores too),
#                (H2O)16/cc-pVDZ and naphthalene/cc-pVTZ (OUTDIR/gpu4pyscf_*.json)
#
# Run from the repository root after infra/gpu_host.sh install, with PYTHONPATH set as it says.
# Each stage goes on past a failing step and ends with the number of failed steps as its status.
# A lease that returns few files: tar OUTDIR afterwards.
set -uo pipefail
stage=$1 out=$2 commit=${3:-}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
failed=0
step() { "$@" || { echo "FAILED: $*"; failed=$((failed + 1)); }; }

case $stage in
    tests)
        step python3 -m pytest -m cuda -q -p no:cacheprovider -rfEs tests/ > "$out/pytest.txt" 2>&1
        tail -25 "$out/pytest.txt" ;;
    refs)
        step python3 benchmarks/reference_runs.py --device cuda --precisions fp64,fp32 \
            ${commit:+--commit "$commit"} --json "$out/reference_cuda.json" ;;
    bench)
        for shape in small medium large; do
            for precision in fp64 fp32 tf32x3 bf16x3; do
                step python3 -m dfmp2 bench --shape $shape --device cuda --precision $precision --repeat 5 --quiet \
                    --json "$out/bench_${shape}_cuda_${precision}.json"
            done
        done
        python3 - "$out" <<'EOF'
import glob, json, sys
for path in sorted(glob.glob(f"{sys.argv[1]}/bench_*_cuda_*.json")):
    r = json.load(open(path)); pair = r["stages"]["pair_energies"]
    print(f"{path.split('/')[-1]:32s} total {r['total_seconds']:.4f} s  pair {pair['seconds']:.4f} s "
          f"{pair['tflops'] or 0:.1f} TFLOPS  gemm {r.get('device_gemm_tflops', 0):.1f}  e_corr {r['e_corr']:.10f}")
EOF
        ;;
    epilogue)
        step python3 benchmarks/bench_cuda_pair_epilogue.py --shapes medium:fp32,large:fp64 --rounds 3 \
            --json "$out/pair_epilogue.json" ;;
    gpu4pyscf)
        for set_up in "benzene cc-pvtz 1 dfmp2,gpu4pyscf,pyscf-cpu" "water16 cc-pvdz 0 dfmp2,gpu4pyscf" \
                      "naphthalene cc-pvtz 0 dfmp2,gpu4pyscf"; do
            read -r name basis warmup contenders <<< "$set_up"
            step python3 benchmarks/bench_gpu4pyscf.py examples/$name.xyz --basis $basis --rounds 2 --warmup $warmup \
                --contenders $contenders --json "$out/gpu4pyscf_${name}_${basis/-/}.json" > "$out/gpu4pyscf_$name.log" 2>&1
            grep -E "^round|failed" "$out/gpu4pyscf_$name.log"
        done ;;
    *) echo "usage: infra/gpu_checks.sh tests|refs|bench|epilogue|gpu4pyscf OUTDIR [COMMIT]" >&2; exit 2 ;;
esac
exit $failed
