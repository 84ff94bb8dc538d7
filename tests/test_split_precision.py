"""Split-precision pair GEMMs (--precision tf32x3 / bf16x3), emulated on the CPU: the operand
rounding against independent roundings, the products' error, and the energies against PySCF."""

import numpy as np
import pytest
import torch

from conftest import converged_rhf, pyscf_reference
from dfmp2 import DFMP2
from dfmp2.util.errors import InputError
from dfmp2.kernels import get_backend
from dfmp2.kernels.torch.split_gemm import round_mantissa, split_operand, split_product

UEH = 1e-6


def _samples(n=200_000, seed=3):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=generator, dtype=torch.float64) * torch.exp(
        torch.randn(n, generator=generator, dtype=torch.float64) * 5)
    return x.to(torch.float32)


def test_bf16_rounding_matches_torch_bfloat16():
    x = _samples()
    ties = torch.tensor([1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, -(1.0 + 2.0**-8)], dtype=torch.float32)  # halfway cases
    for values in (x, ties):
        assert torch.equal(round_mantissa(values, 7), values.to(torch.bfloat16).to(torch.float32))


def test_tf32_rounding_is_nearest_even_to_ten_bits():
    """Against numpy's round-half-to-even on the value scaled by its TF32 unit in the last place."""
    x = _samples().numpy().astype(np.float64)
    ulp = 2.0 ** (np.floor(np.log2(np.abs(x))) - 10)
    expected = np.round(x / ulp) * ulp
    got = round_mantissa(torch.from_numpy(x.astype(np.float32)), 10).numpy().astype(np.float64)
    assert np.array_equal(got, expected)
    ties = torch.tensor([1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11], dtype=torch.float32)
    assert round_mantissa(ties, 10).tolist() == [1.0, 1.0 + 2.0**-9]


@pytest.mark.parametrize("precision, bits", [("tf32x3", 10), ("bf16x3", 7)])
def test_split_parts_are_format_values_summing_to_the_operand(precision, bits):
    x = _samples(20_000)
    hi, lo = split_operand(x, precision)
    for part in (hi, lo):  # every dropped mantissa bit is zero
        assert torch.all((part.view(torch.int32) & ((1 << (23 - bits)) - 1)) == 0)
    rest = (x.double() - hi.double() - lo.double()).abs()
    assert torch.all(rest <= x.double().abs() * 2.0 ** (-2 * bits - 1))


@pytest.mark.parametrize("precision, bound", [("tf32x3", 4e-7), ("bf16x3", 5e-5)])
def test_split_product_error_against_fp64(precision, bound):
    """Relative Frobenius error of A B^T against fp64: TF32x3 about fp32's, BF16x3 the dropped
    lo lo term's 2^-16."""
    generator = torch.Generator().manual_seed(7)
    a = torch.randn(300, 500, generator=generator, dtype=torch.float64)
    b = torch.randn(200, 500, generator=generator, dtype=torch.float64)
    exact = a @ b.T
    got = split_product(a.float(), b.float(), precision).double()
    fp32 = (a.float() @ b.float().T).double()
    error = torch.linalg.norm(got - exact) / torch.linalg.norm(exact)
    assert error < bound
    if precision == "tf32x3":
        assert error < 3 * torch.linalg.norm(fp32 - exact) / torch.linalg.norm(exact)


@pytest.mark.parametrize("precision", ["tf32x3", "bf16x3"])
def test_split_precision_refused_for_energies(precision, tmp_path):
    """Not offered for energies (measured 0.05-36 uEh off fp64 on an H200's tensor cores): the
    drop-in and `dfmp2 run` refuse them with the reason, exit status 2, nothing written."""
    import os
    import subprocess
    import sys

    mf = converged_rhf("water", scf_mode="df")
    with pytest.raises(InputError, match="not offered for energies"):
        DFMP2(mf, precision=precision).kernel()
    water = os.path.join(os.path.dirname(__file__), "..", "examples", "water.xyz")
    out = tmp_path / "out.json"
    proc = subprocess.run([sys.executable, "-m", "dfmp2", "run", water, "--precision", precision, "--json", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "not offered for energies" in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists()


def test_split_precision_bench_times_the_split_products():
    """`dfmp2 bench` runs them (emulated here), on the same synthetic problem: the energy moves
    off fp32's by no more than the products' error (relative 1e-6 TF32x3, 1e-4 BF16x3)."""
    from dfmp2.app.bench import run_bench
    from dfmp2.run.settings import Settings

    records = {p: run_bench(128, 16, 384, repeat=1, settings=Settings(device="cpu", precision=p))
               for p in ("fp32", "tf32x3", "bf16x3")}
    e32 = records["fp32"]["e_corr"]
    for precision, bound in (("tf32x3", 1e-6), ("bf16x3", 1e-4)):
        assert records[precision]["precision"] == precision
        assert 0 < abs(records[precision]["e_corr"] - e32) < bound * abs(e32)


@pytest.mark.parametrize("device", ["trn1", "trn2", "trn3"])
def test_split_precision_refused_on_trainium(device):
    with pytest.raises(InputError, match="tensor cores"):
        get_backend(device, "tf32x3", simulate=True)
