"""Shared fixtures: small molecules, converged PySCF references and PySCF's own DF-MP2."""

import atexit
import json
import os
import shutil
import signal
import tempfile

import pytest
import torch

pyscf = pytest.importorskip("pyscf")
from pyscf import df, gto, scf  # noqa: E402
from pyscf.mp import dfmp2 as pyscf_dfmp2  # noqa: E402

# The CPU products' measured choices (kernels.torch.cpu_gemm) are cached for the test session in a
# directory of its own, removed at the end: tests never write the user's ~/.cache
if "DFMP2_CACHE_DIR" not in os.environ:
    os.environ["DFMP2_CACHE_DIR"] = tempfile.mkdtemp(prefix="dfmp2-test-cache-")
    atexit.register(shutil.rmtree, os.environ["DFMP2_CACHE_DIR"], True)

HERE = os.path.dirname(os.path.abspath(__file__))
# The devices a test of the torch backend runs on: cuda only where torch sees a GPU (`-m cuda` picks it)
TORCH_DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA GPU visible to torch")])]
ROOT = os.path.dirname(HERE)
# Published DF-MP2 reference energies (PySCF and gpu4pyscf test suites), copied from the
# project's shared/reference/energies.json; test_reference_copy_is_current checks the copy.
REFERENCE_FILE = os.path.join(HERE, "data", "reference_energies.json")
SHARED_REFERENCE_FILE = os.path.join(ROOT, "..", "shared", "reference", "energies.json")

MOLECULES = {  # Angstrom
    "water": "O 0 0 0.1173; H 0 0.7572 -0.4692; H 0 -0.7572 -0.4692",
    "ammonia": "N 0 0 0.1129; H 0 0.9377 -0.2633; H 0.8121 -0.4689 -0.2633; H -0.8121 -0.4689 -0.2633",
    "methane": "C 0 0 0; H 0.6291 0.6291 0.6291; H -0.6291 -0.6291 0.6291; "
               "H -0.6291 0.6291 -0.6291; H 0.6291 -0.6291 -0.6291",
    "ethylene": "C 0 0 0.6695; C 0 0 -0.6695; H 0 0.9289 1.2321; H 0 -0.9289 1.2321; "
                "H 0 0.9289 -1.2321; H 0 -0.9289 -1.2321",
    "hf": "F 0 0 0; H 0 0 0.9168",
}

_SCF_CACHE = {}

# The slow tier, run with `python -m pytest -m slow` (the README's command runs the rest, the default
# tier, which covers every module and every refusal within 20 minutes on a 2-core CI machine):
# large molecules, finite differences, long emulations. Each entry is a test (all its cases) or
# one case, with the seconds it took in the full suite on this project's 2-core machine when it
# was moved here (issue 46). An entry that names no collected test is an error.
SLOW = {
    "test_gradients.py::test_unrestricted_double_hybrid_gradient_matches_finite_differences": 194,
    "test_gradients.py::test_double_hybrid_gradient_matches_finite_differences": 184,
    "test_gradients.py::test_cli_double_hybrid_gradient": 56,
    "test_gradients.py::test_gradient_matches_finite_differences[0-df-None-scs]": 31,
    "test_gradients.py::test_gradient_matches_finite_differences[1-exact-None-mp2]": 15,
    "test_gradients.py::test_gradients_on_simulated_trainium[trn1-0.2]": 10,
    "test_gradients.py::test_gradients_on_simulated_trainium[trn3-0.7]": 10,
    "test_gradients.py::test_pyscf_geomopt_drives_dfmp2_to_the_conventional_mp2_minimum": 8,
    "test_nki_pipeline.py::test_trainium_energy_within_a_microhartree_of_fp64[benzene-cc-pvtz-6-trn1-0.2]": 90,
    "test_nki_pipeline.py::test_trainium_energy_within_a_microhartree_of_fp64[benzene-cc-pvtz-6-trn2-0.7]": 31,
    "test_nki_pipeline.py::test_trainium_energy_within_a_microhartree_of_fp64[benzene-aug-cc-pvdz-6-trn1-0.2]": 29,
    "test_nki_pipeline.py::test_trainium_energy_within_a_microhartree_of_fp64[benzene-aug-cc-pvdz-6-trn2-0.7]": 32,
    "test_nki_pipeline.py::test_trainium_energy_within_a_microhartree_of_fp64[benzene-cc-pvtz-6-trn3-0.7]": 34,
    "test_nki_pipeline.py::test_trainium_energy_within_a_microhartree_of_fp64[benzene-aug-cc-pvdz-6-trn3-0.7]": 18,
    "test_nki_pipeline.py::test_trainium_energy_within_a_microhartree_of_fp64[benzene-cc-pvtz-6-trn2-0.6]": 25,
    "test_nki_pipeline.py::test_trainium_energy_within_a_microhartree_of_fp64[benzene-cc-pvtz-6-trn3-0.6]": 25,
    "test_nki_pipeline.py::test_trainium_energy_within_a_microhartree_of_fp64[benzene-aug-cc-pvdz-6-trn2-0.6]": 17,
    "test_nki_pipeline.py::test_trainium_energy_within_a_microhartree_of_fp64[benzene-aug-cc-pvdz-6-trn3-0.6]": 17,
    "test_nki_pipeline.py::test_specializations_do_not_grow_with_the_molecule": 77,
    "test_nki_pipeline.py::test_simulated_trainium_matches_cpu": 31,
    "test_scf_builds.py::test_trainium_whole_job_envelope_at_triple_zeta": 107,
    "test_scf_builds.py::test_trainium_builds_converge_to_the_fp64_energy[uhf-pbe0-1-1]": 11,
    "test_scf_builds.py::test_trainium_builds_converge_to_the_fp64_energy[rhf-b3lyp-0-0]": 6,
    "test_scf_builds.py::test_trainium_builds_converge_to_the_fp64_energy[rhf-pbe-0-0]": 6,
    "test_scf_builds.py::test_converged_energy_matches_pyscf[fp64-uhf-pbe0-1-1]": 8,
    "test_scf_builds.py::test_converged_energy_matches_pyscf[fp64-rohf-b3lyp-1-1]": 8,
    "test_scf_builds.py::test_converged_energy_matches_pyscf[mixed-rohf-b3lyp-1-1]": 8,
    "test_scf_builds.py::test_trainium_double_hybrid_matches_the_host": 8,
    "test_sparse.py::test_trainium_screened_run_matches_dense": 91,
    "test_sparse.py::test_screened_run_matches_dense_and_pyscf[1-uhf]": 18,
    "test_sparse.py::test_screened_run_matches_dense_and_pyscf[1-rohf]": 15,
    "test_optimize.py::test_twenty_atom_optimisation_converges_to_alkane_bond_lengths": 110,
    "test_optimize.py::test_radical_optimisation_matches_the_conventional_ump2_optimum": 13,
    "test_distributed.py::test_checkpoint_over_ranks_resumes_after_a_kill": 15,
    "test_distributed.py::test_a_lost_rank_file_makes_every_rank_remake_b": 10,
    "test_distributed.py::test_checkpoint_of_another_run_is_refused_by_every_rank": 9,
    "test_distributed.py::test_gloo_ranks_give_the_one_process_energy[3-fp64-1e-10]": 7,
    "test_distributed.py::test_gradients_over_ranks_equal_one_process[3-methyl.xyz-extra1]": 9,
    "test_distributed.py::test_screened_run_over_two_ranks": 7,
    "test_team_agreement.py::test_ranks_given_different_inputs_all_stop_before_any_work[basis]": 25,
    "test_team_agreement.py::test_ranks_given_different_inputs_all_stop_before_any_work[frozen-core]": 23,
    "test_team_agreement.py::test_a_rank_refused_after_joining_stops_every_rank": 24,
    "test_team_agreement.py::test_drop_in_ranks_with_different_molecules_stop": 21,
    "test_bench.py::test_energy_negative_and_finite_for_every_shape[large]": 44,
    "test_bench.py::test_energy_negative_and_finite_for_every_shape[medium]": 8,
    "test_bench.py::test_model_only_gives_the_full_emulations_modelled_time": 8,
    "test_memory_budget.py::test_peak_stays_within_the_budget[90]": 33,
    "test_memory_budget.py::test_molecule_with_scf_stays_within_the_budget[pyscf-480]": 18,
    "test_memory_budget.py::test_gradient_stays_within_the_budget": 60,
    "test_memory_limits.py::test_water16_runs_in_a_2500_mb_cgroup_without_max_memory": 115,
    "test_budget_rule.py::test_water8_runs_at_470_mb_as_with_a_checkpoint": 36,
    "test_budget_rule.py::test_qcengine_runs_water8_in_a_520_mb_cgroup": 40,
    "test_nki_kernels.py::test_ao2mo_streams_c_vir_for_any_nao[trn2-0.6-3000-230-131-2]": 13,
    "test_nki_kernels.py::test_pair_energy_streams_b_j_for_any_size": 7,
    "test_gpu_references.py::test_cpu_fp64_matches_gpu_fp64[naphthalene-cc-pvtz]": 24,
    "test_gpu_references.py::test_cpu_fp64_matches_gpu_fp64[benzene-cc-pvtz]": 14,
    "test_gpu_references.py::test_cpu_fp64_matches_gpu_fp64[naphthalene-cc-pvdz]": 9,
    "test_pipeline.py::test_out_of_core_reads_within_the_target[0.25]": 51,
    "test_split_precision.py::test_split_precision_bench_times_the_split_products": 11,
    "test_double_hybrids.py::test_cli_double_hybrid_closed_and_open_shell": 11,
    "test_make_page.py::test_page_from_results": 9,
}


def pytest_collection_modifyitems(config, items):
    """Mark the SLOW tests `slow`; an entry of a collected file that names no test is an error
    (a renamed test must not drop out of the tiers unseen)."""
    used, files = set(), set()
    for item in items:
        path, _, name = item.nodeid.rpartition("::")
        base = os.path.basename(path)
        files.add(base)
        for key in (f"{base}::{name}", f"{base}::{name.split('[', 1)[0]}"):
            if key in SLOW:
                item.add_marker(pytest.mark.slow)
                used.add(key)
    stale = sorted(key for key in SLOW if key.split("::", 1)[0] in files and key not in used)
    if stale and not config.getoption("keyword") and not any("::" in arg for arg in config.args):
        raise pytest.UsageError(f"conftest.SLOW names tests that do not exist: {stale}")


@pytest.fixture(autouse=True)
def _signal_dispositions_restored():
    """The CLI's `main`, called in-process by some tests, leaves SIGINT/SIGTERM/SIGHUP ignored
    once a run has succeeded (it is the process's entry point: a late signal must not turn a
    finished run into a failure). Restored after each test, or every later subprocess would
    inherit the ignores (and a Ctrl-C test would find its child deaf to SIGINT)."""
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    saved = {signum: signal.getsignal(signum) for signum in signals}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def converged_rhf(name, basis="cc-pvdz", scf_mode="exact", atom=None, unit="Angstrom",
                  conv_tol=1e-12):
    """A tightly converged PySCF RHF (cached per set-up)."""
    key = (name, basis, scf_mode, atom, unit, conv_tol)
    if key not in _SCF_CACHE:
        mol = gto.M(atom=atom or MOLECULES[name], unit=unit, basis=basis, verbose=0)
        mf = scf.RHF(mol)
        if scf_mode == "df":
            mf = mf.density_fit()
        mf.conv_tol = conv_tol
        mf.kernel()
        assert mf.converged
        _SCF_CACHE[key] = mf
    return _SCF_CACHE[key]


def pyscf_reference(mf, auxbasis, frozen=None):
    """PySCF's DFMP2 with an explicit MP2 auxiliary basis -> (e_corr, e_os, e_ss)."""
    pt = pyscf_dfmp2.DFMP2(mf, frozen=frozen)
    pt.with_df = df.DF(mf.mol, auxbasis=auxbasis)
    pt.kernel()
    return pt.e_corr, pt.e_corr_os, pt.e_corr_ss


def mp2fit_auxbasis(mol):
    return df.make_auxbasis(mol, mp2fit=True)


def load_reference_cases():
    with open(REFERENCE_FILE, encoding="utf-8") as handle:
        return json.load(handle)["cases"]


@pytest.fixture
def arrays_only_budget(monkeypatch):
    """For in-process tests of tight plans (disk storage, smallest blocks): --max-memory counts
    the pipeline's arrays only, as if the process had no footprint of its own. The pytest
    process's resident set drifts by megabytes between calls, more than a tight plan's slack;
    the whole-process budget is tested on real runs in test_memory_budget.py."""
    from dfmp2.run import memory

    monkeypatch.setattr(memory, "resident_bytes", lambda: 0)
