"""The CPU and the emulated Trainium paths against the GPU reference runs
(benchmarks/results/reference_cuda.json: `dfmp2 run` set-ups on an NVIDIA H200 in fp64, made by
benchmarks/reference_runs.py): CPU fp64 to 1e-8 Eh, emulated Trainium (fp32) to 1 uEh."""

import json
import os

import pytest

from dfmp2.api.driver import run_xyz

ROOT = os.path.join(os.path.dirname(__file__), "..")
with open(os.path.join(ROOT, "benchmarks", "results", "reference_cuda.json"), encoding="utf-8") as _handle:
    REFERENCE = json.load(_handle)
GPU_FP64 = {(r["molecule"], r["basis"]): r for r in REFERENCE["runs"] if r["precision"] == "fp64"}


@pytest.mark.parametrize("molecule, basis", sorted(GPU_FP64))
def test_cpu_fp64_matches_gpu_fp64(molecule, basis):
    gpu = GPU_FP64[(molecule, basis)]
    cpu = run_xyz(os.path.join(ROOT, gpu["xyz"]), basis=basis, spin=gpu["spin"], device="cpu", precision="fp64")
    assert (cpu.as_dict()["nbasis"], cpu.as_dict()["naux"]) == (gpu["nbasis"], gpu["naux"])
    assert abs(cpu.e_ref - gpu["e_ref"]) < 1e-8
    assert abs(cpu.e_corr - gpu["e_corr"]) < 1e-8 and abs(cpu.e_tot - gpu["e_tot"]) < 1e-8


@pytest.mark.parametrize("device, molecule", [("trn2", "water"), ("trn1", "methyl")])
def test_emulated_trainium_within_1uEh_of_gpu_fp64(device, molecule):
    gpu = GPU_FP64[(molecule, "cc-pvdz")]
    trn = run_xyz(os.path.join(ROOT, gpu["xyz"]), basis="cc-pvdz", spin=gpu["spin"], device=device, simulate=True)
    assert trn.as_dict()["device"] == device and trn.as_dict()["precision"] == "fp32"
    assert abs(trn.e_corr - gpu["e_corr"]) < 1e-6 and abs(trn.e_tot - gpu["e_tot"]) < 1e-6
