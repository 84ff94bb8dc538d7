"""DF-MP2 through the NKI kernels on the emulator (--device trn1|trn2 --simulate), compile
economy, and the Trainium device rules (no silent fallback)."""

import importlib.util
import os
import types

import pytest
import torch

from conftest import ROOT, converged_rhf
from dfmp2 import DFMP2, ComputationError, InputError
from dfmp2.chem import build_molecule, read_xyz, run_scf
from dfmp2.kernels.nki.launch import pair_blocks

NKI_KERNELS = {"gemm_kernel", "syrk_kernel", "trsm_kernel", "ao2mo_kernel", "pair_energy_kernel"}
# fp64 host work: the Cholesky factor of PySCF's fp64 (P|Q), and the inverses of L's 128 x 128
# diagonal blocks for the trsm kernel
# and the cutting of the transform's fp64 operands into exact 7-bit slices
HOST_STEPS = {"host:cholesky", "host:invert_panel", "host:slice_operands"}
# layout changes done in device HBM between kernels (into and out of the three-center store)
DEVICE_STEPS = {"device:copy"}
# specializations: the pair kernel's triangle and rectangle launches, each at two block sizes
PAIR_SPECIALIZATIONS = 4
FP32_TOL = 1e-6  # Eh versus the fp64 CPU result


def example_mf(name):
    mol = build_molecule(read_xyz(os.path.join(ROOT, "examples", f"{name}.xyz")), "cc-pvdz")
    return run_scf(mol, "df")


_MF = {}


def mean_field(name):
    if name not in _MF:
        _MF[name] = example_mf(name)
    return _MF[name]


@pytest.mark.parametrize("target", ["trn1", "trn2", "trn3"])
@pytest.mark.parametrize("molecule", ["water", "benzene"])
def test_simulated_trainium_matches_cpu(molecule, target):
    mf = mean_field(molecule)
    cpu = DFMP2(mf).run()
    trn = DFMP2(mf, device=target, simulate=True).run()
    result = trn.result
    assert abs(trn.e_corr - cpu.e_corr) < FP32_TOL
    assert abs(trn.e_corr_os - cpu.e_corr_os) < FP32_TOL
    assert abs(trn.e_corr_ss - cpu.e_corr_ss) < FP32_TOL
    # every transform / solve / energy step ran as an NKI kernel; the only host work is the fp64
    # factorisation of the fp64 metric (no device GEMM / SYRK: those would round (P|Q) to fp32)
    assert set(result.kernels) == NKI_KERNELS - {"gemm_kernel", "syrk_kernel"} | HOST_STEPS | DEVICE_STEPS
    assert result.backend == "nki" and result.device == target and result.simulated
    assert result.precision == "fp32"
    # compile economy: one specialization per kernel but the pair kernel's, at most 8 in all
    assert_few_specializations(result)
    # B in one block: one pair-energy launch per block pair of <= 32 x 32 orbitals (j <= i)
    nocc = result.correlation.nocc
    assert result.correlation.plan.occ_block == nocc
    nblocks = len(pair_blocks(nocc))
    assert result.kernels["pair_energy_kernel"] == nblocks * (nblocks + 1) // 2
    assert set(result.modelled_seconds) == {"trn1", "trn2", "trn3"} and min(result.modelled_seconds.values()) > 0


def assert_few_specializations(result):
    counts = {k: len(v) for k, v in result.kernel_specializations.items()}
    assert counts.get("pair_energy_kernel", 0) <= PAIR_SPECIALIZATIONS, counts
    assert all(n <= 2 for k, n in counts.items() if k != "pair_energy_kernel"), counts
    assert sum(counts.values()) <= 8, counts


def test_specializations_do_not_grow_with_the_molecule():
    for name in ("water", "benzene", "naphthalene"):
        assert_few_specializations(DFMP2(mean_field(name), device="trn1", simulate=True).run().result)


def test_small_memory_budget_on_simulated_trn1_still_few_specializations(arrays_only_budget):
    mf = converged_rhf("ethylene")
    from dfmp2.api.driver import run_mean_field
    from dfmp2.util.system_memory import MB

    roomy = run_mean_field(mf, device="trn1", simulate=True)
    tight = run_mean_field(mf, device="trn1", simulate=True,
                           max_memory=roomy.correlation.plan.minimum * 1.05 / MB)
    assert tight.correlation.plan.aux_block < tight.correlation.naux
    assert tight.kernels["ao2mo_kernel"] > roomy.kernels["ao2mo_kernel"]
    assert_few_specializations(tight)
    assert abs(tight.e_corr - roomy.e_corr) < 1e-7


def test_trainium_without_sdk_is_an_error_not_a_fallback():
    if importlib.util.find_spec("torch_neuronx") is not None:
        pytest.skip("the Neuron SDK is installed here")
    mf = converged_rhf("water")
    for target in ("trn1", "trn2", "trn3"):
        with pytest.raises(ComputationError, match="Neuron SDK.*torch_neuronx.*dfmp2\\[neuron\\]"):
            DFMP2(mf, device=target).kernel()


def test_trainium_option_rules():
    mf = converged_rhf("water")
    with pytest.raises(InputError, match="no fp64"):
        DFMP2(mf, device="trn1", precision="fp64", simulate=True).kernel()
    with pytest.raises(InputError, match="^simulate, model_only and nki_api apply to trn1, trn2, trn3"):
        DFMP2(mf, device="cpu", simulate=True).kernel()
    with pytest.raises(InputError, match="^transform applies to trn1, trn2, trn3; cpu transforms in fp64"):
        DFMP2(mf, device="cpu", transform="fp32").kernel()
    with pytest.raises(InputError, match="unknown transform 'fp16'"):
        DFMP2(mf, device="trn2", simulate=True, transform="fp16").kernel()


@pytest.mark.parametrize("target", ["trn1", "trn2", "trn3"])
@pytest.mark.parametrize("molecule", ["water", "benzene"])
def test_plain_fp32_transform_on_double_zeta(molecule, target):
    """transform="fp32" (one plain fp32 product per half): what ran is recorded, and on these
    double-zeta cases it stays inside 1 uEh of fp64 (measured -9e-8 and -2.7e-7 Eh); on
    triple-zeta and diffuse sets it does not (README), hence "exact" is the default."""
    mf = mean_field(molecule)
    cpu = DFMP2(mf).run()
    trn = DFMP2(mf, device=target, simulate=True, transform="fp32").run()
    assert trn.result.transform == "fp32" and "transform" in trn.result.as_dict()
    assert "host:slice_operands" not in trn.result.kernels
    # (mn|P) crosses as fp32 values, one "slice": [1, nP, nao, nao]
    (shapes,) = trn.result.kernel_specializations["ao2mo_kernel"]
    assert shapes[0][0] == 1
    for part in ("e_corr", "e_corr_os", "e_corr_ss"):
        assert abs(getattr(trn, part) - getattr(cpu, part)) < FP32_TOL, part


@pytest.mark.nki_simulator
def test_kernels_under_aws_nki_simulate():
    """With AWS's own `nki` installed, run the kernel source under nki.simulate."""
    spec = importlib.util.find_spec("nki")
    if spec is None:
        pytest.skip("AWS's nki package (Neuron pip repository) is not installed")
    import nki
    import numpy as np

    from dfmp2.kernels.nki import kernels as nki_kernels

    rng = np.random.default_rng(0)
    a_t = rng.standard_normal((256, 128)).astype(np.float32)
    b = rng.standard_normal((256, 512)).astype(np.float32)
    out = nki.simulate(nki_kernels.gemm_kernel)(a_t, b)
    assert np.allclose(out, a_t.T @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.neuron
def test_water_on_trainium_hardware():
    """Real Trainium. Skipped without the SDK unless DFMP2_REQUIRE_NKI=1, which makes it fail."""
    from dfmp2.kernels.nki.support import neuron_sdk_missing

    missing = neuron_sdk_missing()
    if missing:
        if os.environ.get("DFMP2_REQUIRE_NKI") == "1":
            pytest.fail(f"DFMP2_REQUIRE_NKI=1 but the Neuron SDK is missing: {', '.join(missing)}")
        pytest.skip("no Neuron SDK / Trainium device here")
    mf = mean_field("water")
    cpu = DFMP2(mf).run()
    trn = DFMP2(mf, device="trn1").run()
    assert trn.result.backend == "nki" and not trn.result.simulated
    assert abs(trn.e_corr - cpu.e_corr) < FP32_TOL


def test_singular_metric_on_simulated_trn1_uses_host_eigen_then_gemm_kernel():
    from pyscf import gto

    mf = converged_rhf("water")
    ri_o, ri_h = gto.basis.load("cc-pvdz-ri", "O"), gto.basis.load("cc-pvdz-ri", "H")
    duplicated = {"O": ri_o + ri_o[:3], "H": ri_h + ri_h[:1]}  # exactly linearly dependent
    trn = DFMP2(mf, auxbasis=duplicated, device="trn1", simulate=True).run()
    assert "eigen" in trn.result.correlation.metric
    assert trn.result.kernels["host:eigh"] == 1 and trn.result.kernels["gemm_kernel"] >= 1
    assert abs(trn.e_corr - DFMP2(mf, auxbasis="cc-pvdz-ri").kernel()[0]) < FP32_TOL


# ---- NKI releases: which one runs, and pairs AWS does not support ------------------------------
def test_emulated_nki_release_is_recorded():
    mf = mean_field("water")
    assert DFMP2(mf, device="trn1", simulate=True).run().result.nki_api == "0.2"
    pt = DFMP2(mf, device="trn2", simulate=True, nki_api="0.3")
    pt.kernel(with_t2=False)  # (the default would add a note: no t2 on a NeuronCore)
    record = pt.result.as_dict()
    assert record["nki_api"] == "0.3" and record["notes"] == []
    assert "nki 0.3 rules" in record["device_description"]


def test_trn1_with_nki_0_3_runs_with_an_announcement():
    pt = DFMP2(mean_field("water"), device="trn1", simulate=True, nki_api="0.3")
    pt.kernel(with_t2=False)
    result = pt.result
    assert result.nki_api == "0.3"
    assert len(result.notes) == 1 and "Neuron SDK 2.28 (nki 0.2)" in result.notes[0]


@pytest.mark.parametrize("api", ["0.4", "0.6"])
def test_trn1_with_newer_emulated_nki_is_bad_input(api):
    from dfmp2.util.errors import InputError
    from dfmp2.kernels import get_backend

    with pytest.raises(InputError, match=rf"^device='trn1' with the emulated nki {api}: AWS does not support"):
        get_backend("trn1", simulate=True, nki_api=api)


@pytest.mark.parametrize("api, variable, lnc", [("0.7", None, 1), ("0.7", "1", 1), ("0.6", None, 2), ("0.6", "1", 1)])
def test_trn2_compiles_every_kernel_at_one_lnc_degree(monkeypatch, api, variable, lnc):
    """nki 0.7 (Neuron SDK 2.33) checks that every kernel runs at neuronx-cc's LNC degree (EVRF066,
    rule L14): dfmp2 compiles all of them at LNC=1 there. Under 0.6 the SPMD kernels (trsm, ao2mo,
    pair energy) span the LNC=2 logical core unless NEURON_LOGICAL_NC_CONFIG=1 says otherwise. The
    energy is the fp64 CPU run's either way, and the record says the release and the degree."""
    if variable is None:
        monkeypatch.delenv("NEURON_LOGICAL_NC_CONFIG", raising=False)
    else:
        monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", variable)
    from dfmp2.kernels.nki.launch import KernelLauncher

    grids, launch = {}, KernelLauncher.launch

    def launch_and_note_grid(self, kernel_name, arrays, useful_flops, host_bytes, grid=1, prefetched=False):
        grids.setdefault(kernel_name, set()).add(grid)
        return launch(self, kernel_name, arrays, useful_flops, host_bytes, grid, prefetched)

    monkeypatch.setattr(KernelLauncher, "launch", launch_and_note_grid)
    mf = mean_field("water")
    cpu = DFMP2(mf).run()
    trn = DFMP2(mf, device="trn2", simulate=True, nki_api=api).run()
    assert abs(trn.e_corr - cpu.e_corr) < FP32_TOL
    record = trn.result.as_dict()
    assert (record["nki_api"], record["neuron_sdk"], record["lnc"]) == (api, {"0.6": "2.32", "0.7": "2.33"}[api], lnc)
    spmd = {"trsm_kernel", "ao2mo_kernel", "pair_energy_kernel"}
    assert {k: g for k, g in grids.items() if k in spmd} == {k: {lnc} for k in spmd}
    assert all(g == {1} for k, g in grids.items() if k not in spmd)


@pytest.mark.parametrize("api, variable, message", [
    ("0.7", "2", r"^NEURON_LOGICAL_NC_CONFIG=2 with nki 0\.7 \(Neuron SDK 2\.33\): its compiler wants every kernel "
                 r"at one LNC degree \(EVRF066\) and this run launches kernels with no two-program form, so its "
                 r"kernels run at LNC=1"),
    ("0.6", "4", r"^NEURON_LOGICAL_NC_CONFIG='4': the Neuron SDK supports an LNC degree of 1 or 2$"),
    ("0.6", "2", r"^NEURON_LOGICAL_NC_CONFIG=2 with nki 0\.6 \(Neuron SDK 2\.32\): every kernel's LNC value must match "
                 r"NEURON_LOGICAL_NC_CONFIG \(nki\.jit: a mismatch is a runtime error\) and this run launches kernels"),
])
def test_an_lnc_setting_the_run_cannot_honour_is_refused(monkeypatch, api, variable, message):
    from dfmp2.kernels import get_backend

    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", variable)
    with pytest.raises(InputError, match=message):
        get_backend("trn2", simulate=True, nki_api=api)


@pytest.mark.parametrize("target", ["trn2", "trn3"])
@pytest.mark.parametrize("variable", [None, "2", "1"])
def test_nki_0_7_keeps_lnc_2_for_a_run_whose_kernels_all_split(monkeypatch, target, variable):
    """Under nki 0.7 a run that launches only kernels with a two-program form (an MP2 energy from given
    orbitals: `dfmp2 bench`'s synthetic shapes) keeps neuronx-cc's LNC=2 unless NEURON_LOGICAL_NC_CONFIG=1
    says otherwise: every launch spans both cores, the emulator's L14 accepts each, and the energy is
    the CPU's; the record says the degree."""
    from dfmp2.app.bench import run_bench
    from dfmp2.kernels.nki.launch import KernelLauncher

    if variable is None:
        monkeypatch.delenv("NEURON_LOGICAL_NC_CONFIG", raising=False)
    else:
        monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", variable)
    grids, launch = set(), KernelLauncher.launch

    def launch_and_note_grid(self, kernel_name, arrays, useful_flops, host_bytes, grid=1, prefetched=False):
        grids.add((kernel_name, grid))
        return launch(self, kernel_name, arrays, useful_flops, host_bytes, grid, prefetched)

    monkeypatch.setattr(KernelLauncher, "launch", launch_and_note_grid)
    lnc = 1 if variable == "1" else 2
    trn = run_bench(96, 12, 256, repeat=0, device=target, simulate=True, nki_api="0.7")
    cpu = run_bench(96, 12, 256, repeat=0, precision="fp64")
    assert abs(trn["e_corr"] - cpu["e_corr"]) < FP32_TOL
    assert trn["lnc"] == lnc and trn["nki_api"] == "0.7"
    assert grids == {(k, lnc) for k in ("trsm_kernel", "ao2mo_kernel", "pair_energy_kernel")}


def test_a_kernel_launched_off_the_runs_lnc_degree_is_refused_before_it_runs():
    """A run compiled at LNC=2 under nki 0.7 that launches a single-program kernel (a wrong declaration
    of its kernels) stops with one line naming the kernel, before the emulator or neuronx-cc sees it."""
    from dfmp2.kernels import get_backend

    backend = get_backend("trn2", simulate=True, nki_api="0.7", kernels=("gemm_kernel",))
    assert backend.lnc == 2
    x = torch.ones((128, 128), dtype=torch.float32)
    with pytest.raises(ComputationError, match=r"^exact_matmul_kernel launched on 1 core\(s\) in a run compiled at "
                                               r"LNC=2: nki 0\.7 \(Neuron SDK 2\.33\) wants every kernel at one LNC"):
        backend.launcher.launch("exact_matmul_kernel", (x, x), 0, 0)
    assert "exact_matmul_kernel" not in backend.calls


def test_trn1_refuses_lnc_2(monkeypatch):
    from dfmp2.kernels import get_backend

    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    with pytest.raises(InputError, match=r"^NEURON_LOGICAL_NC_CONFIG=2 on trn1: trn1 runs LNC=1 only"):
        get_backend("trn1", simulate=True)


@pytest.mark.parametrize("api, lnc", [("0.7", 1), ("0.6", 2), ("0.3", 2)])
def test_trn3_lnc_degree_follows_the_release(monkeypatch, api, lnc):
    """trn3 as trn2: neuronx-cc's LNC=2 default before nki 0.7, every kernel at LNC=1 under 0.7."""
    from dfmp2.kernels import get_backend

    monkeypatch.delenv("NEURON_LOGICAL_NC_CONFIG", raising=False)
    assert get_backend("trn3", simulate=True, nki_api=api).lnc == lnc


def test_trn3_with_nki_0_2_is_refused():
    """Trn3 first appears in AWS's release manifest with Neuron SDK 2.29 (nki 0.3); SDK 2.28 (nki 0.2)
    lists trn1, inf2 and trn2 only. Emulated (--nki-api) and installed alike."""
    from dfmp2.util.errors import ComputationError, InputError
    from dfmp2.kernels import get_backend

    with pytest.raises(InputError, match=r"^device='trn3' with the emulated nki 0\.2: AWS does not support "
                                         r"that pair \(supported on trn3: nki 0\.3, 0\.4, 0\.5, 0\.6, 0\.7; "
                                         r"trn3 needs Neuron SDK 2\.29 to 2\.33; SDK 2\.28 \(nki 0\.2\) does not "
                                         r"list Trn3\)"):
        get_backend("trn3", simulate=True, nki_api="0.2")
    from dfmp2.kernels.nki import support as nki_support

    with pytest.raises(ComputationError, match=r"^device='trn3' with the installed nki 0\.2: AWS does not support"):
        nki_support.check_nki_support("trn3", "0.2", installed=True)
    for api in ("0.3", "0.6", "0.7"):
        assert nki_support.check_nki_support("trn3", api, installed=True) is None
    backend = get_backend("trn3", simulate=True, nki_api="0.3")
    assert backend.nki_api == "0.3" and "NeuronCore-v4 limits, nki 0.3 rules" in backend.describe()


@pytest.mark.parametrize("installed, ok", [("0.2", True), ("0.6", False), (None, False)])
def test_installed_nki_checked_before_anything_compiles(monkeypatch, installed, ok):
    """On a Trainium host (SDK importable) an installed nki that AWS does not support on the
    target stops the run with a ComputationError before the backend is built."""
    from dfmp2.util.errors import ComputationError
    from dfmp2.kernels import get_backend
    from dfmp2.kernels.nki import backend as nki_backend, support as nki_support

    built = []
    monkeypatch.setattr(nki_support, "neuron_sdk_missing", lambda: [])
    monkeypatch.setattr(nki_support, "installed_nki_api", lambda: installed)
    monkeypatch.setattr(nki_backend, "NkiBackend",
                        lambda *args, **kwargs: built.append(args) or types.SimpleNamespace())
    if ok:
        get_backend("trn1")
        assert built
    else:
        with pytest.raises(ComputationError, match=r"^device='trn1' with the installed nki .*: AWS does not "
                                                   r"support that pair .* Nothing was compiled"):
            get_backend("trn1")
        assert not built


# ---- fp32 device energies inside the envelope ----------------------------------------------------
@pytest.mark.parametrize("target, api", [("trn1", "0.2"), ("trn2", "0.6"), ("trn2", "0.7"), ("trn3", "0.6"),
                                         ("trn3", "0.7")])
@pytest.mark.parametrize("name, basis, frozen", [("benzene", "cc-pvtz", 6), ("water", "aug-cc-pvtz", 1),
                                                ("benzene", "aug-cc-pvdz", 6)])
def test_trainium_energy_within_a_microhartree_of_fp64(target, api, name, basis, frozen):
    """Emulated Trainium (fp32 device arithmetic, exact-product AO->MO transform: 4 digits of
    (mn|P), 5 slices of C) against the fp64 CPU result on a triple-zeta and two augmented bases:
    1 uEh. The plain fp32 transform missed this on benzene/cc-pVTZ (-1.2 uEh) and on
    benzene/aug-cc-pVDZ by 2.45 mEh, the worst cancellation of the three."""
    mol = build_molecule(read_xyz(os.path.join(ROOT, "examples", f"{name}.xyz")), basis)
    mf = run_scf(mol, "df")
    cpu = DFMP2(mf, frozen=frozen).run()
    trn = DFMP2(mf, frozen=frozen, device=target, simulate=True, nki_api=api).run()
    assert trn.result.precision == "fp32" and trn.result.kernels["ao2mo_kernel"] >= 1
    for part in ("e_corr", "e_corr_os", "e_corr_ss"):
        assert abs(getattr(trn, part) - getattr(cpu, part)) < 1e-6, part
