"""The CPU configuration (dfmp2/util/cpu_config.py): one table per CPU vendor, the user's
environment variable wins, bad values are bad input, and every result records the choices and
who set each threading variable."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from dfmp2.util import cpu_config
from dfmp2.util.errors import InputError

from test_cli import describe
from test_workflows import WATER, write

AMD = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9R14\n\nprocessor\t: 1\n"
INTEL = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8488C\n"


@pytest.mark.parametrize("text, vendor, model", [(AMD, "AuthenticAMD", "AMD EPYC 9R14"),
                                                 (INTEL, "GenuineIntel", "Intel(R) Xeon(R) Platinum 8488C"),
                                                 ("processor\t: 0\n", "", "")])
def test_cpu_identity_from_cpuinfo(tmp_path, text, vendor, model):
    path = write(tmp_path / "cpuinfo", text)
    found = cpu_config.cpu_identity(str(path))
    assert (found["vendor"], found["model"]) == (vendor, model)
    assert (found["family"], found["model_number"], found["stepping"], found["kernel_flags"]) == (None, None, None, [])


ZEN4 = ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\n"
        "stepping\t: 1\nflags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw avx512_bf16 avx512_vnni\n\n"
        "processor\t: 1\nvendor_id\t: AuthenticAMD\ncpu family\t: 99\nflags\t\t: amx_tile\n")


def test_cpu_identity_tells_generations_apart(tmp_path):
    """Zen 4 and Zen 5 both say "AMD EPYC": the family, model number and stepping and the
    kernel-deciding flags of the first processor tell them apart (the second block is not read)."""
    found = cpu_config.cpu_identity(str(write(tmp_path / "cpuinfo", ZEN4)))
    assert (found["family"], found["model_number"], found["stepping"]) == (25, 17, 1)
    assert found["kernel_flags"] == ["avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16"]


def test_the_table_decides_per_vendor_and_the_users_variable_wins():
    """The fp64 square: not kept on AMD (measured there), kept elsewhere (measured on Intel);
    DFMP2_SCF_FP64_SQUARE=1/0 overrides either and says so."""
    amd, intel = {"vendor": "AuthenticAMD", "model": ""}, {"vendor": "GenuineIntel", "model": ""}
    assert cpu_config.choice("scf_fp64_square", {}, amd).value is False
    assert cpu_config.choice("scf_fp64_square", {}, amd).source.startswith("table for AuthenticAMD: AMD EPYC")
    assert cpu_config.choice("scf_fp64_square", {}, intel).value is True
    assert cpu_config.choice("scf_fp64_square", {}, intel).source.startswith("default (GenuineIntel): Intel Xeon")
    for value in ("0", "1"):
        for identity in (amd, intel):
            found = cpu_config.choice("scf_fp64_square", {"DFMP2_SCF_FP64_SQUARE": value}, identity)
            assert (found.value, found.source) == (value == "1", f"DFMP2_SCF_FP64_SQUARE={value} (set by the user)")
    with pytest.raises(InputError, match="DFMP2_SCF_FP64_SQUARE='yes': expected 1 or 0"):
        cpu_config.choice("scf_fp64_square", {"DFMP2_SCF_FP64_SQUARE": "yes"}, amd)


def test_a_bad_configuration_variable_is_bad_input_before_anything_runs(tmp_path):
    write(tmp_path / "w.xyz", WATER)
    proc = subprocess.run([sys.executable, "-m", "dfmp2", "run", "w.xyz"], cwd=tmp_path, capture_output=True,
                          text=True, env=dict(os.environ, DFMP2_SCF_FP64_SQUARE="maybe"), timeout=300)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, describe(proc)
    assert "DFMP2_SCF_FP64_SQUARE='maybe'" in proc.stderr


def test_the_record_says_who_set_each_threading_variable(tmp_path):
    """`import dfmp2` sets OMP_WAIT_POLICY and OPENBLAS_THREAD_TIMEOUT where the user has not; a
    user's value is kept and recorded as the user's."""
    code = ("import json, dfmp2; from dfmp2.util.cpu_config import configuration_record; "
            "print(json.dumps(configuration_record()['environment']))")
    env = {k: v for k, v in os.environ.items() if k not in cpu_config.RECORDED_VARIABLES}
    env["OMP_WAIT_POLICY"] = "ACTIVE"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    recorded = json.loads(out.stdout)
    assert recorded["OMP_WAIT_POLICY"] == {"value": "ACTIVE", "set_by": "user"}
    assert recorded["OPENBLAS_THREAD_TIMEOUT"] == {"value": "4", "set_by": "dfmp2"}


def test_a_run_records_its_configuration_and_the_choice_decides_the_copies(tmp_path):
    """`dfmp2 run` (mixed-precision SCF on the CPU): the JSON's cpu_configuration holds this CPU
    and the choice with its source; the SCF kept the fp64 square exactly when the choice wants
    it (the budget holds it here); the energy does not depend on it (E_HF to 1e-10 Eh)."""
    write(tmp_path / "w.xyz", WATER)
    energies = {}
    for square64 in ("0", "1"):
        proc = subprocess.run([sys.executable, "-m", "dfmp2", "run", "w.xyz", "--basis", "cc-pvtz", "--json",
                               "o.json", "--quiet"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                              env=dict(os.environ, DFMP2_SCF_FP64_SQUARE=square64))
        assert proc.returncode == 0, describe(proc)
        record = json.loads((tmp_path / "o.json").read_text())
        configuration = record["cpu_configuration"]
        assert configuration["cpu"] == cpu_config.cpu_identity()
        assert configuration["choices"]["scf_fp64_square"] == {
            "value": square64 == "1", "source": f"DFMP2_SCF_FP64_SQUARE={square64} (set by the user)"}
        assert ("square 64" in record["scf_builds"]["storage"]) == (square64 == "1")
        energies[square64] = record["e_hf"], record["e_tot"]
    # the SCF (what the square serves) to 1e-10 Eh; the total within the fp32 MP2 step's rounding of
    # orbitals that differ in their last digits (measured 4.3e-10 Eh under MKL)
    assert abs(energies["0"][0] - energies["1"][0]) < 1e-10
    assert abs(energies["0"][1] - energies["1"][1]) < 1e-8


def test_fp32_squares_gathered_equal_the_scattered_ones():
    """TriangleBlocks.square: the fp32 gather (cpu) gives the same square as the two scatters."""
    from dfmp2.kernels.torch.fitted import TriangleBlocks

    nao = 37
    rng = np.random.default_rng(3)
    packed = torch.as_tensor(rng.standard_normal((5, nao * (nao + 1) // 2)))
    unpack = TriangleBlocks(nao, "cpu")
    gathered = unpack.square(packed, torch.float32)
    reference = torch.zeros(5, nao * nao, dtype=torch.float32)
    reference.index_copy_(1, unpack.upper, packed.float())
    reference.index_copy_(1, unpack.lower, packed.float())
    assert torch.equal(gathered.reshape(5, -1), reference)
    square = unpack.square(packed, torch.float64)
    assert torch.equal(square.float(), gathered) and torch.equal(square, square.transpose(1, 2))
