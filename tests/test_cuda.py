"""CUDA path: same energies as the CPU. Marked `cuda`; skipped where torch sees no GPU.

Run on a GPU machine with:  python -m pytest -m cuda -q
"""

import pytest
import torch

from conftest import converged_rhf, pyscf_reference
from dfmp2 import DFMP2

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible to torch"),
]


@pytest.mark.parametrize("name", ["water", "ethylene"])
def test_cuda_fp64_matches_pyscf(name):
    mf = converged_rhf(name, scf_mode="df")
    pt = DFMP2(mf, frozen=1, auxbasis="cc-pvdz-ri", device="cuda").run()
    assert pt.result.device == "cuda" and pt.result.backend == "torch"
    assert torch.cuda.get_device_name(0) in pt.result.device_description
    e_ref, os_ref, ss_ref = pyscf_reference(mf, "cc-pvdz-ri", 1)
    assert abs(pt.e_corr - e_ref) < 1e-8
    assert abs(pt.e_corr_os - os_ref) < 1e-8 and abs(pt.e_corr_ss - ss_ref) < 1e-8


def test_cuda_fp32_within_envelope():
    mf = converged_rhf("ethylene", scf_mode="df")
    e64, _ = DFMP2(mf, frozen=2).kernel()
    e32, _ = DFMP2(mf, frozen=2, device="cuda", precision="fp32").kernel()
    assert abs(e32 - e64) < 1e-6


def test_cuda_disk_store_matches(tmp_path, arrays_only_budget):
    from dfmp2.api.driver import run_mean_field
    from dfmp2.util.system_memory import MB

    mf = converged_rhf("ethylene")
    roomy = run_mean_field(mf, device="cuda")
    tight = run_mean_field(mf, device="cuda", max_memory=roomy.correlation.plan.minimum * 1.02 / MB,
                           scratch=str(tmp_path))
    assert tight.correlation.plan.storage == "disk"
    assert abs(tight.e_corr - roomy.e_corr) < 1e-10


@pytest.mark.parametrize("precision, tol", [("fp64", 1e-8), ("fp32", 1e-6)])
def test_cuda_uhf_and_rohf(precision, tol):
    """Open shells on the GPU: UHF against PySCF's DFUMP2, ROHF-MBPT(2) against the CPU."""
    from pyscf import df, gto, scf
    from pyscf.mp.dfump2 import DFUMP2

    mol = gto.M(atom="O 0 0 0.6035; O 0 0 -0.6035", basis="cc-pvdz", spin=2, verbose=0)
    uhf = scf.UHF(mol).density_fit().run(conv_tol=1e-12)
    ref = DFUMP2(uhf, frozen=1)
    ref.with_df = df.DF(mol, auxbasis="cc-pvdz-ri")
    ref.kernel()
    pt = DFMP2(uhf, frozen=1, auxbasis="cc-pvdz-ri", device="cuda", precision=precision).run()
    assert abs(pt.e_corr - ref.e_corr) < tol and abs(pt.e_corr_ss - ref.e_corr_ss) < tol
    rohf = scf.ROHF(mol).density_fit().run(conv_tol=1e-12)
    cpu, gpu = DFMP2(rohf, frozen=1).run(), DFMP2(rohf, frozen=1, device="cuda", precision=precision).run()
    assert abs(gpu.e_corr - cpu.e_corr) < tol and gpu.e_corr_singles == pytest.approx(cpu.e_corr_singles)


def test_cuda_density_and_double_hybrid():
    """The unrelaxed density and a double hybrid's PT2 part on the GPU equal the CPU's."""
    import numpy as np
    from pyscf import dft, gto

    from dfmp2.chem.functionals import DOUBLE_HYBRIDS

    mf = converged_rhf("ethylene")
    cpu, gpu = DFMP2(mf, frozen=2).make_rdm1(), DFMP2(mf, frozen=2, device="cuda").make_rdm1()
    assert np.abs(gpu - cpu).max() < 1e-10
    mol = gto.M(atom="O 0 0 0.1173; H 0 0.7572 -0.4692; H 0 -0.7572 -0.4692", basis="cc-pvdz", verbose=0)
    ks = dft.RKS(mol, xc=DOUBLE_HYBRIDS["B2PLYP"].xc).run(conv_tol=1e-10)
    e_cpu = DFMP2(ks).double_hybrid_energy("B2PLYP")
    e_gpu = DFMP2(ks, device="cuda").double_hybrid_energy("B2PLYP")
    assert abs(e_gpu - e_cpu) < 1e-10


@pytest.mark.parametrize("spin", [0, 1])
def test_cuda_scf_builds_match_pyscf_builds(spin):
    """dfmp2's SCF J/K builds on the GPU (the default of dfmp2 run --device cuda) give PySCF's
    builds' energies: E(SCF) to 1e-9 Eh, E_total to 1e-8 Eh."""
    import os

    from dfmp2.api.driver import run_xyz

    path = os.path.join(os.path.dirname(__file__), "..", "examples", "methyl.xyz" if spin else "water.xyz")
    ours = run_xyz(path, device="cuda", spin=spin)
    theirs = run_xyz(path, device="cuda", spin=spin, scf_backend="pyscf")
    assert ours.as_dict()["scf_backend"] == "torch" and ours.as_dict()["device"] == "cuda"
    assert abs(ours.e_ref - theirs.e_ref) < 1e-9 and abs(ours.e_tot - theirs.e_tot) < 1e-8


@pytest.mark.parametrize("precision", ["tf32x3", "bf16x3"])
def test_cuda_split_precision_bench_on_tensor_cores(precision):
    """`dfmp2 bench` runs the split products on the tensor cores (energies refuse them): the
    record says so, and the energy stays within relative 1e-4 of the fp32 run's (measured on an
    H200: 2e-5 to 5e-5 at the large shape, the tensor cores' truncated fp32 sums)."""
    from dfmp2.app.bench import run_bench
    from dfmp2.run.settings import Settings

    e32 = run_bench(512, 64, 1536, repeat=1, settings=Settings(device="cuda", precision="fp32"))["e_corr"]
    record = run_bench(512, 64, 1536, repeat=1, settings=Settings(device="cuda", precision=precision))
    assert record["precision"] == precision and record["device"] == "cuda"
    assert 0 < abs(record["e_corr"] - e32) < 1e-4 * abs(e32)


def test_cuda_pinned_uploads_keep_each_block():
    """Large host blocks go through two reused pinned buffers, chunk by chunk: each upload equals
    its own array (no buffer is refilled before its last DMA has finished), in the asked dtype."""
    import numpy as np

    from dfmp2.kernels import get_backend
    from dfmp2.kernels.torch.pinned_staging import PINNED_CHUNK_BYTES

    backend = get_backend("cuda", "fp32")
    n = 2 * PINNED_CHUNK_BYTES // 8 + 1001  # three chunks: both buffers, the first one twice
    blocks = [np.random.default_rng(k).standard_normal(n) for k in range(3)]
    on_device = [backend.to_device(b, fp64=True) for b in blocks] + [backend.to_device(blocks[0])]
    for b, t in zip(blocks + blocks[:1], on_device):
        assert t.is_cuda and np.array_equal(t.cpu().numpy(), b.astype(t.cpu().numpy().dtype))
    assert on_device[0].dtype == torch.float64 and on_device[3].dtype == torch.float32
    cube = np.random.default_rng(9).standard_normal((40, 300, 400)).transpose(2, 0, 1)  # not C-contiguous
    assert np.array_equal(backend.to_device(cube, fp64=True).cpu().numpy(), cube)


def test_cuda_memory_budget_from_the_device():
    """The plan takes the GPU's free memory as its device budget, and a run's peak device
    allocation stays inside it."""
    from dfmp2.api.driver import run_mean_field
    from dfmp2.kernels import get_backend

    backend = get_backend("cuda", "fp32")
    free, total = torch.cuda.mem_get_info()
    assert 0 < backend.memory_limit_bytes() <= total
    torch.cuda.reset_peak_memory_stats()
    result = run_mean_field(converged_rhf("ethylene", basis="cc-pvtz"), device="cuda", precision="fp32")
    assert 0 < torch.cuda.max_memory_allocated() < free and result.e_corr < 0


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL across ranks needs two GPUs")
def test_cuda_two_ranks_nccl(tmp_path):
    """Two ranks, one GPU each, over NCCL: the energy of one process."""
    import json
    import os
    import subprocess
    import sys

    water = os.path.join(os.path.dirname(__file__), "..", "examples", "water.xyz")
    out = tmp_path / "two.json"
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                    "-m", "dfmp2", "run", water, "--device", "cuda", "--precision", "fp64", "--json", str(out)],
                   check=True, timeout=600)
    from dfmp2.api.driver import run_xyz

    one = run_xyz(water, device="cuda", precision="fp64")
    two = json.loads(out.read_text())
    assert two["distributed"]["ranks"] == 2 and abs(two["e_tot"] - one.e_tot) < 1e-10


@pytest.mark.parametrize("spin", [0, 1])
def test_cuda_gradient_matches_the_cpu(spin):
    """Analytic DF-MP2 gradients with the pair stage, the three-index density, the Lagrangian's
    GEMMs and the CPHF's J/K on the GPU (fp64): the CPU's gradient to 1e-9 Eh/bohr. RHF water
    with a DF SCF and frozen core; the UHF hydroxyl radical with an exact SCF and SCS scalings."""
    import numpy as np
    from pyscf import gto, scf

    from dfmp2 import native

    if spin == 0:
        mol = gto.M(atom="O 0 0 0.1173; H 0 0.7572 -0.4692; H 0.05 -0.7572 -0.4692", basis="cc-pvdz", verbose=0)
        mf, cls, frozen = scf.RHF(mol).density_fit().run(conv_tol=1e-12), native.DFMP2, 1
    else:
        mol = gto.M(atom="O 0 0 0.1; H 0 0.1 1.05", basis="cc-pvdz", spin=1, verbose=0)
        mf, cls, frozen = scf.UHF(mol).run(conv_tol=1e-12), native.SCSMP2, None
    cpu = cls(mf, frozen=frozen, auxbasis="cc-pvdz-ri").nuc_grad_method().kernel()
    gpu = cls(mf, frozen=frozen, auxbasis="cc-pvdz-ri", device="cuda", precision="fp64").nuc_grad_method().kernel()
    assert np.abs(gpu - cpu).max() < 1e-9 and np.abs(cpu).max() > 1e-3


def test_cuda_cli_grad_with_dipole_and_double_hybrid(tmp_path):
    """`dfmp2 grad --device cuda --properties dipole --precision fp64`: the JSON's
    gradient and relaxed dipole equal the CPU's to 1e-9; the response's J/K were whitened on the
    GPU; the same for a B2PLYP gradient (the CPKS with PySCF's XC kernel)."""
    import json
    import os
    import subprocess
    import sys

    import numpy as np

    water = os.path.join(os.path.dirname(__file__), "..", "examples", "water.xyz")

    def grad(device, *extra):
        out = tmp_path / f"{device}{len(extra)}.json"
        proc = subprocess.run([sys.executable, "-m", "dfmp2", "grad", water, "--device", device, "--precision", "fp64",
                               *extra, "--json", str(out)], capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        return json.loads(out.read_text())

    cpu, gpu = grad("cpu", "--properties", "dipole"), grad("cuda", "--properties", "dipole")
    assert gpu["device"] == "cuda" and gpu["precision"] == "fp64" and gpu["gradient_jk"]["whitening"].startswith("cuda")
    assert np.abs(np.array(gpu["gradient"]) - cpu["gradient"]).max() < 1e-9
    assert np.abs(np.array(gpu["dipole"]) - cpu["dipole"]).max() < 1e-9
    dh_cpu, dh_gpu = grad("cpu", "--xc", "B2PLYP"), grad("cuda", "--xc", "B2PLYP")
    assert np.abs(np.array(dh_gpu["gradient"]) - dh_cpu["gradient"]).max() < 1e-9


@pytest.mark.parametrize("precision", ["fp64", "fp32"])
def test_cuda_fused_pair_epilogue_equals_torch_ops(precision):
    """The GPU's pair energies go through one Triton kernel (D, t and both sums in registers);
    they equal the torch-ops epilogue's (the CPU's code) to 1e-12 relative, same-spin and
    across spins, ragged tiles included, and the record counts the fused calls."""
    from dfmp2.kernels import get_backend
    from dfmp2.run.memory import MemoryPlan

    backend = get_backend("cuda", precision, warm_kernels=True)
    backend.prepare(MemoryPlan(budget=1, aux_block=1, occ_block=1, storage="memory", minimum=1))
    assert backend._fused_pair_sums is not None and not backend.notes
    g = torch.Generator(device="cuda").manual_seed(3)
    dtype = backend.compute_dtype

    def rand(*shape, shift=0.0):
        return (torch.rand(*shape, generator=g, device="cuda", dtype=torch.float64) + shift).to(dtype)

    b_i, b_j, b_k = rand(5, 77, 300, shift=-0.5), rand(3, 77, 300, shift=-0.5), rand(4, 45, 300, shift=-0.5)
    e_i, e_j, e_v, e_vk = rand(5, shift=-2.0), rand(3, shift=-2.0), rand(77, shift=1.0), rand(45, shift=1.0)
    fused = backend.pair_energy(b_i, b_j, e_i, e_j, e_v), backend.pair_energy(b_i, b_k, e_i, e_j[:1].repeat(4), e_v, e_vk)
    assert backend.calls["pair_epilogue_fused"] == 2
    backend._fused_pair_sums = None
    plain = backend.pair_energy(b_i, b_j, e_i, e_j, e_v), backend.pair_energy(b_i, b_k, e_i, e_j[:1].repeat(4), e_v, e_vk)
    # fp32: torch ops form e_i - e_a in fp32 before the cast, the kernel in fp64 (1e-8 relative)
    tol = 1e-12 if precision == "fp64" else 1e-7
    for (os_f, ss_f), (os_p, ss_p) in zip(fused, plain):
        assert abs(os_f - os_p) <= tol * abs(os_p) and abs(ss_f - ss_p) <= tol * abs(os_p)
    assert fused[1][1] == 0.0 and fused[0][1] != 0.0


def test_cuda_out_of_core_gradient_matches_the_cpu(tmp_path, arrays_only_budget):
    """B on disk at the smallest budget on the GPU: the densities stream B's slabs against blocks
    of k on the GPU and G goes to HDF5 scratch; the gradient equals the CPU's in-memory one to
    1e-9 Eh/bohr (RHF ethylene, DF SCF, frozen core), and close() leaves no scratch."""
    import numpy as np
    from pyscf import gto, scf

    from dfmp2.api.driver import run_mean_field
    from dfmp2.util.system_memory import MB
    from dfmp2.mp2.gradient import nuclear_gradient_of_run as nuclear_gradient
    from dfmp2.run.settings import Settings

    mol = gto.M(atom="C 0 0 0.6695; C 0 0 -0.6695; H 0 0.9289 1.2321; H 0 -0.9289 1.2321; H 0 0.9289 -1.2321; "
                     "H 0 -0.9289 -1.2321", basis="cc-pvdz", verbose=0)
    mf = scf.RHF(mol).density_fit().run(conv_tol=1e-10)
    settings = Settings(device="cuda", precision="fp64", auxbasis="cc-pvdz-ri", frozen=2, with_rdm1=True,
                        with_gamma=True)
    cpu_settings = settings.replace(device="cpu")
    expected = nuclear_gradient(mf, run_mean_field(mf, cpu_settings).correlation, cpu_settings)[0]
    roomy = run_mean_field(mf, settings)
    tight = run_mean_field(mf, settings.replace(max_memory=roomy.correlation.plan.minimum * 1.02 / MB,
                                                scratch=str(tmp_path)))
    assert tight.correlation.plan.storage == "disk" and tight.correlation.plan.slab_rows < 6
    assert tight.correlation.gamma.kind == "disk"
    gradient = nuclear_gradient(mf, tight.correlation, settings.replace(scratch=str(tmp_path)))[0]
    assert np.abs(gradient - expected).max() < 1e-9 and tight.as_dict()["device"] == "cuda"
    for result in (tight, roomy):
        result.correlation.gamma.close()
    assert not any(tmp_path.iterdir())


def test_cuda_fused_epilogue_where_it_pays(monkeypatch):
    """The fused epilogue's one-time load (~0.5 s) is paid only where the run amortises it: a
    water run takes the torch ops, `dfmp2 bench` (warm passes) the kernel, and a run whose pair
    stage reaches the threshold the kernel; the records' kernel counts say which ran."""
    from dfmp2.app.bench import run_bench
    from dfmp2.api.driver import run_mean_field
    from dfmp2.kernels.torch import backend as torch_backend

    mf = converged_rhf("water", scf_mode="df")
    monkeypatch.setattr(torch_backend, "_FUSED_EPILOGUE_LOADED", [])
    small = run_mean_field(mf, device="cuda")
    assert small.kernels.get("pair_epilogue_fused", 0) == 0 and small.kernels["pair_energy"] > 0
    bench = run_bench(128, 16, 384, repeat=1, device="cuda", precision="fp32")
    assert bench["kernels"]["pair_epilogue_fused"] == bench["kernels"]["pair_energy"]
    monkeypatch.setattr(torch_backend, "_FUSED_EPILOGUE_LOADED", [])
    monkeypatch.setattr(torch_backend, "FUSED_EPILOGUE_MIN_ELEMENTS", 1000)
    big = run_mean_field(mf, device="cuda")
    assert big.kernels["pair_epilogue_fused"] == big.kernels["pair_energy"]
    assert abs(big.e_corr - small.e_corr) < 1e-10


def test_cuda_libraries_count_in_the_footprint_before_the_plan():
    """The memory plan measures the process's footprint before the SCF (--max-memory's early
    check). On a GPU the libraries a run calls (cuBLAS, cuBLASLt, cuSOLVER: hundreds of MB of host
    pages) are loaded when the backend is made, so a run's first GEMMs, factorisation and solves in
    both precisions add little resident set afterwards (< 64 MB), in a fresh process."""
    import subprocess
    import sys

    script = """
import numpy as np
from dfmp2.kernels import get_backend
from dfmp2.run.memory import resident_bytes
backend = get_backend("cuda", "fp32")
before = resident_bytes()
a = np.random.default_rng(0).standard_normal((300, 300))
metric = a @ a.T + 300 * np.eye(300)
lower = backend.cholesky(metric)
solved = backend.solve_lower_transposed(lower, backend.to_device(a, fp64=True))
products = [(backend.to_device(a, fp64=f) @ backend.to_device(a, fp64=f)).sum().item() for f in (False, True)]
backend.synchronize()
print((resident_bytes() - before) / 2**20)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert float(done.stdout.split()[-1]) < 64


@pytest.mark.parametrize("scf_device, mp2_device", [("cpu", "cuda"), ("cuda", "cpu")])
def test_gradient_after_dfmp2_builds_on_another_device(scf_device, mp2_device):
    """The JK-fit metric's factor made by the SCF's builds (use_dfmp2_jk on one device) is handed to the
    response's builds on the run's device (issue 64: one factorisation per run): it is moved there, and the
    gradient equals the one of an SCF whose builds ran on the run's device."""
    import numpy as np
    from pyscf import gto, scf

    import dfmp2

    mol = gto.M(atom="O 0 0 0.1173; H 0 0.7572 -0.4692; H 0 -0.7572 -0.4692", basis="cc-pvdz", verbose=0)
    grads = []
    for device in (scf_device, mp2_device):
        mf = dfmp2.use_dfmp2_jk(scf.RHF(mol).density_fit(), device=device)
        mf.conv_tol = 1e-11
        mf.run()
        grads.append(DFMP2(mf, auxbasis="cc-pvdz-ri", device=mp2_device).nuc_grad_method().kernel())
    assert np.abs(grads[0] - grads[1]).max() < 1e-7
