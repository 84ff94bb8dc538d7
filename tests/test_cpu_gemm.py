"""The CPU products' libraries (kernels.torch.cpu_gemm): each one's results against fp64, the choice made
by measuring and cached, a user's pin respected, an unwritable cache an untuned run with a note, a
second library the same energies, and a record that says what ran."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from dfmp2.kernels.torch import cpu_gemm, cpu_solves
from dfmp2.util import cpu_config
from dfmp2.util.errors import InputError

from conftest import ROOT

LIBRARIES = list(cpu_config.GEMM_LIBRARIES)


def operands(shape_a, shape_b, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(shape_a, generator=generator, dtype=dtype),
            torch.randn(shape_b, generator=generator, dtype=dtype))


@pytest.mark.parametrize("library", LIBRARIES)
@pytest.mark.parametrize("precision", ["fp32", "fp64"])
@pytest.mark.parametrize("layout", ["plain", "b transposed", "a transposed", "batched", "into a slice"])
def test_each_library_computes_the_product_to_its_precision(library, precision, layout):
    """C = A B on every library that takes the product, against the fp64 product of the same
    operands: fp32 to 2e-6 of the largest element (rounding of a 300-term sum), fp64 to 1e-13."""
    if precision not in cpu_config.GEMM_LIBRARIES[library]:
        pytest.skip(f"{library} has no {precision} products")
    dtype = torch.float32 if precision == "fp32" else torch.float64
    if layout == "batched":
        a, b = operands((5, 70, 300), (5, 300, 90), dtype)
    else:
        a, b = operands((300, 70) if layout == "a transposed" else (70, 300),
                        (90, 300) if layout == "b transposed" else (300, 90), dtype)
        a = a.transpose(0, 1) if layout == "a transposed" else a
        b = b.transpose(0, 1) if layout == "b transposed" else b
    expected = a.double() @ b.double()
    if layout == "into a slice":
        whole = torch.full((70, 120), 7.0, dtype=dtype)
        got = cpu_gemm._CALLS[library](a, b, out=whole[:, 10:100])
        assert float(whole[:, :10].sub(7).abs().max()) == 0 and float(whole[:, 100:].sub(7).abs().max()) == 0
    else:
        got = cpu_gemm._CALLS[library](a, b)
    scale = float(expected.abs().max())
    assert float((got.double() - expected).abs().max()) / scale < (2e-6 if precision == "fp32" else 1e-13)


def test_the_pins_are_parsed_and_checked_in_one_place():
    assert cpu_config.gemm_pins({}) == {}
    assert cpu_config.gemm_pins({"DFMP2_GEMM": "openblas"}) == {"fp32": "openblas", "fp64": "openblas"}
    assert cpu_config.gemm_pins({"DFMP2_GEMM": "onednn"}) == {"fp32": "onednn"}
    assert cpu_config.gemm_pins({"DFMP2_GEMM": "fp32=onednn, fp64=MKL"}) == {"fp32": "onednn", "fp64": "mkl"}
    for bad, says in (("blis", "unknown library 'blis'"), ("fp16=mkl", "unknown precision 'fp16'"),
                      ("fp64=onednn", "onednn has no fp64 products")):
        with pytest.raises(InputError, match=says):
            cpu_config.check_environment({"DFMP2_GEMM": bad})


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """A new process's choices, cached in tmp_path/cache."""
    monkeypatch.setenv("DFMP2_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("DFMP2_GEMM", raising=False)
    with cpu_gemm.fresh_state() as state:
        yield state


def test_the_choice_is_measured_once_and_cached(fresh, tmp_path):
    """The first product of a bucket is measured (every library that takes it has a rate, the
    fastest is chosen) and cached under this machine's identity; a new process reads it back and
    measures nothing; the product itself is right whichever library ran it."""
    a, b = operands((600, 500), (500, 400), torch.float32)
    c = cpu_gemm.matmul("pair", a, b)
    assert float((c.double() - a.double() @ b.double()).abs().max()) < 1e-3
    key = cpu_gemm.key_of("pair", "fp32", a, b)
    entry = fresh.entries[key]
    assert entry.source == "measured" and set(entry.rates) <= {"mkl", "onednn", "openblas"} and "mkl" in entry.rates
    assert entry.library == max(entry.rates, key=entry.rates.get)
    held = json.load(open(fresh.path))
    assert held["identity"] == cpu_gemm.identity() and held["choices"][key]["library"] == entry.library
    assert os.path.dirname(fresh.path) == str(tmp_path / "cache")
    with cpu_gemm.fresh_state() as again:
        cpu_gemm.matmul("pair", a, b)
        assert again.entries[key].source == "cache" and again.measure_seconds == 0.0
        record = cpu_gemm.record()
    assert record["tuned"] and record["fp32"]["library"] == entry.library
    assert record["fp32"]["flops_by_library"] == {entry.library: 2.0 * 600 * 500 * 400}


def test_a_foreign_or_damaged_cache_is_measured_again_with_a_note(fresh):
    a, b = operands((600, 500), (500, 400), torch.float64)
    cpu_gemm.matmul("pair", a, b)
    path = fresh.path
    held = json.load(open(path))
    held["identity"]["threads"] = 999
    open(path, "w").write(json.dumps(held))
    with cpu_gemm.fresh_state() as again:
        cpu_gemm.matmul("pair", a, b)
        assert any("not this machine's" in note and "threads" in note for note in again.notes)
        assert all(e.source == "measured" for e in again.entries.values())
    open(path, "w").write("{ cut")
    with cpu_gemm.fresh_state() as again:
        cpu_gemm.matmul("pair", a, b)
        assert any("could not be read" in note for note in again.notes)


def test_an_unwritable_cache_is_an_untuned_run_with_a_note(tmp_path, monkeypatch):
    """A cache directory that cannot be made (under a regular file: refused to root too): nothing
    is measured, every product runs on torch's library, and the note says why and what to do."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("DFMP2_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.delenv("DFMP2_GEMM", raising=False)
    with cpu_gemm.fresh_state() as state:
        a, b = operands((600, 500), (500, 400), torch.float32)
        cpu_gemm.matmul("pair", a, b)
        record = cpu_gemm.record()
        assert state.entries == {} and state.measure_seconds == 0.0
    assert not record["tuned"] and record["cache"] is None
    assert record["fp32"]["flops_by_library"] == {"mkl": 2.0 * 600 * 500 * 400}
    assert any("untuned" in note and "DFMP2_CACHE_DIR" in note for note in record["notes"])


def test_a_pin_decides_and_nothing_is_measured(fresh, monkeypatch):
    monkeypatch.setenv("DFMP2_GEMM", "fp32=openblas,fp64=mkl")
    with cpu_gemm.fresh_state() as state:
        for dtype in (torch.float32, torch.float64):
            cpu_gemm.matmul("pair", *operands((600, 500), (500, 400), dtype))
        record = cpu_gemm.record()
        assert state.entries == {}
    assert record["pinned"] == {"fp32": "openblas", "fp64": "mkl"}
    assert set(record["fp32"]["flops_by_library"]) == {"openblas"} and record["fp32"]["library"] == "openblas"
    assert set(record["fp64"]["flops_by_library"]) == {"mkl"}


def test_the_users_kernel_pin_is_respected_and_recorded():
    """OPENBLAS_CORETYPE (whatever this machine sets; the tests never change it) is part of the
    cache's identity and of OpenBLAS's kernels in the record, which name what threadpoolctl
    reports numpy's OpenBLAS running."""
    from threadpoolctl import threadpool_info

    pin = os.environ.get("OPENBLAS_CORETYPE")
    assert cpu_gemm.identity()["variables"].get("OPENBLAS_CORETYPE") == pin
    words = cpu_gemm.kernels("openblas")
    architectures = {i.get("architecture") for i in threadpool_info() if "numpy" in i.get("filepath", "")}
    assert any(arch and arch in words for arch in architectures)
    assert (f"OPENBLAS_CORETYPE={pin}, respected" in words) if pin else ("as it detects" in words)


def run_cli(tmp_path, *extra, env=None):
    out = tmp_path / f"r{len(os.listdir(tmp_path))}.json"
    done = subprocess.run([sys.executable, "-m", "dfmp2", "run", os.path.join(ROOT, "examples", "water.xyz"),
                           "--basis", "cc-pvtz", "--json", str(out), *extra], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())


def test_a_second_library_gives_the_same_energies(tmp_path):
    """fp64 on mkl and on openblas: the SCF and E(corr) to 1e-10 Eh; fp32 on mkl and on onednn and
    openblas: within the fp32 envelope (2e-7 Eh) of each other. Each record names the library that
    ran every product of its precision."""
    fp64 = {lib: run_cli(tmp_path, "--precision", "fp64", env={"DFMP2_GEMM": lib}) for lib in ("mkl", "openblas")}
    assert abs(fp64["mkl"]["e_hf"] - fp64["openblas"]["e_hf"]) < 1e-10
    assert abs(fp64["mkl"]["e_corr"] - fp64["openblas"]["e_corr"]) < 1e-10
    fp32 = {lib: run_cli(tmp_path, env={"DFMP2_GEMM": f"fp32={lib}"}) for lib in ("mkl", "onednn", "openblas")}
    for lib, record in fp32.items():
        assert abs(record["e_corr"] - fp32["mkl"]["e_corr"]) < 2e-7
        assert set(record["cpu_configuration"]["gemm"]["fp32"]["flops_by_library"]) == {lib}
    assert set(fp64["openblas"]["cpu_configuration"]["gemm"]["fp64"]["flops_by_library"]) == {"openblas"}


def test_dfmp2_tune_measures_and_caches(tmp_path):
    env = {**os.environ, "DFMP2_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "dfmp2", "tune", "--json", str(tmp_path / "t.json")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    record = json.loads((tmp_path / "t.json").read_text())
    assert record["choices"] and all(c["source"] == "measured" for c in record["choices"].values())
    assert os.path.exists(record["cache"]) and "onednn" in done.stdout
    blocked = {**env, "DFMP2_CACHE_DIR": str(tmp_path / "t.json" / "cache")}
    done = subprocess.run([sys.executable, "-m", "dfmp2", "tune"], capture_output=True, text=True, env=blocked,
                          timeout=300)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "DFMP2_CACHE_DIR" in done.stderr


def test_a_gram_product_is_measured_apart(fresh):
    """B_i B_i^T (a pair block with itself: numpy runs it as a SYRK, half the flops) has a choice of
    its own, apart from B_i B_j^T of the same shape; both are right on whichever library ran them."""
    a, other = operands((800, 600), (800, 600), torch.float32)
    for b in (a.transpose(0, 1), other.transpose(0, 1)):
        c = cpu_gemm.matmul("pair", a, b)
        assert float((c.double() - a.double() @ b.double()).abs().max()) < 1e-3
    keys = sorted(fresh.entries)
    assert keys == ["pair/fp32/1024x512x1024/nt", "pair/fp32/1024x512x1024/nts"], keys


def test_the_half_transform_takes_the_form_measured_faster(fresh):
    """X^P = F^T B^P (B^P symmetric) batched or stacked: the form is measured once per bucket and
    cached; either form's X equals the fp64 product (fp32: 2e-6 of its largest element)."""
    from dfmp2.kernels import get_backend

    backend = get_backend("cpu", "fp32")
    generator = torch.Generator().manual_seed(1)
    block = torch.randn((12, 200, 200), generator=generator)
    block = block + block.transpose(1, 2)
    factor = torch.randn((200, 30), generator=generator)
    expected = factor.double().T @ block.double()
    for _ in range(2):
        x = backend.half_transform(block, factor)
        assert x.shape == (12, 30, 200)
        assert float((x.double() - expected).abs().max()) / float(expected.abs().max()) < 2e-6
    forms = {key: e for key, e in fresh.entries.items() if key.endswith("/forms")}
    assert len(forms) == 1 and next(iter(forms.values())).library in cpu_gemm.FORMS
    assert set(next(iter(forms.values())).rates) == {"batched", "stacked"}
    with cpu_gemm.fresh_state() as again:
        backend.half_transform(block, factor)
        assert again.entries[next(iter(forms))].source == "cache"


def test_a_pinned_library_that_cannot_run_is_an_error(fresh, monkeypatch):
    """No silent substitute: DFMP2_GEMM=onednn where this torch has no oneDNN matmul is refused."""
    from dfmp2.kernels.torch import cpu_libraries

    monkeypatch.setenv("DFMP2_GEMM", "onednn")
    monkeypatch.setattr(cpu_libraries, "onednn_available", lambda: "this torch was built without oneDNN")
    with cpu_gemm.fresh_state():
        with pytest.raises(InputError, match="DFMP2_GEMM pins onednn.*without oneDNN"):
            cpu_gemm.matmul("pair", *operands((600, 500), (500, 400), torch.float32))


def test_tune_measures_the_libraries_again_and_drops_the_forms(fresh):
    """After a run cached a half transform's form and a pair product's library, tune measures the
    library's bucket again and drops the form (the next run that needs it measures it)."""
    from dfmp2.kernels import get_backend
    from dfmp2.linalg import cpu as cpu_blas

    block = torch.randn((12, 200, 200))
    get_backend("cpu", "fp32").half_transform(block + block.transpose(1, 2), torch.randn((200, 30)))
    cpu_gemm.matmul("pair", *operands((600, 500), (500, 400), torch.float32))
    assert any(key.endswith("/forms") for key in fresh.entries)
    libraries = cpu_gemm.held_keys()
    record = cpu_blas.tune()
    assert not any(key.endswith("/forms") for key in fresh.entries)
    assert sorted(fresh.entries) == libraries and all(fresh.entries[k].source == "measured" for k in libraries)
    assert set(libraries) <= set(record["choices"])
    with cpu_gemm.fresh_state():
        assert cpu_gemm.held_keys() == libraries  # the cache as tune wrote it


# ----------------------------------------------------------------------------- the triangular solves

def lower_and_rows(n, m, dtype, seed=3):
    """A well-conditioned lower triangle L [n, n] (the Cholesky factor of a random SPD matrix) and
    rows X [m, n]."""
    generator = torch.Generator().manual_seed(seed)
    a = torch.randn((n, n), generator=generator, dtype=torch.float64)
    lower = torch.linalg.cholesky(a @ a.T / n + torch.eye(n, dtype=torch.float64))
    return lower.to(dtype), torch.randn((m, n), generator=generator, dtype=dtype)


@pytest.mark.parametrize("library", list(cpu_config.SOLVE_LIBRARIES))
@pytest.mark.parametrize("precision", ["fp32", "fp64"])
@pytest.mark.parametrize("layout", ["rows", "a transposed view"])
def test_each_solve_library_whitens_to_its_precision(library, precision, layout):
    """B = X L^-T on every library with a solve, against SciPy's fp64 solve of the same operands
    (B L^T = X): fp32 to 1e-5 of the largest element, fp64 to 1e-12; X itself is left as it was."""
    import scipy.linalg

    dtype = torch.float32 if precision == "fp32" else torch.float64
    lower, rows = lower_and_rows(300, 170, dtype)
    if layout == "a transposed view":
        rows = rows.T.contiguous().T
    before = rows.clone()
    got = cpu_gemm._SOLVES[library](lower, rows)
    expected = scipy.linalg.solve_triangular(lower.double().numpy(), rows.double().numpy().T, lower=True).T
    assert got.shape == rows.shape and torch.equal(rows, before)
    scale = float(np.abs(expected).max())
    assert float(np.abs(got.double().numpy() - expected).max()) / scale < (1e-5 if precision == "fp32" else 1e-12)


def test_the_solve_is_measured_once_cached_and_recorded(fresh):
    """A whitening's solve is measured like a product (mkl and SciPy's OpenBLAS, the fastest kept),
    cached, read back by a new process, and recorded apart from the GEMMs ("solves")."""
    lower, rows = lower_and_rows(400, 3000, torch.float64)
    got = cpu_solves.solve_lower_transposed("trsm", lower, rows)
    assert float((got @ lower.T - rows).abs().max()) < 1e-10
    key = cpu_solves.solve_key("trsm", "fp64", rows)
    entry = fresh.entries[key]
    assert key == "trsm/fp64/4096x512/solve" and set(entry.rates) == {"mkl", "scipy-openblas"}
    assert entry.library == max(entry.rates, key=entry.rates.get)
    with cpu_gemm.fresh_state() as again:
        cpu_solves.solve_lower_transposed("trsm", lower, rows)
        assert again.entries[key].source == "cache" and again.measure_seconds == 0.0
        record = cpu_gemm.record()
    solves = record["solves"]["fp64"]
    assert solves["library"] == entry.library and solves["flops_by_library"] == {entry.library: 3000.0 * 400 * 400}
    assert "fp64" not in record  # no GEMM ran: the products' section is the GEMMs' alone
    assert ("SciPy's OpenBLAS" in solves["kernels"]) == (entry.library == "scipy-openblas")


def test_a_pin_or_an_untuned_run_solves_on_torchs_library(fresh, monkeypatch, tmp_path):
    lower, rows = lower_and_rows(400, 3000, torch.float32)
    monkeypatch.setenv("DFMP2_GEMM", "openblas")
    with cpu_gemm.fresh_state() as state:
        cpu_solves.solve_lower_transposed("trsm", lower, rows)
        assert state.entries == {} and cpu_gemm.record()["solves"]["fp32"]["library"] == "mkl"
    monkeypatch.delenv("DFMP2_GEMM")
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("DFMP2_CACHE_DIR", str(blocker / "cache"))
    with cpu_gemm.fresh_state() as state:
        cpu_solves.solve_lower_transposed("trsm", lower, rows)
        assert state.entries == {} and cpu_gemm.record()["solves"]["fp32"]["flops_by_library"] == {"mkl": 3000.0 * 400 * 400}


def test_either_solve_library_gives_the_same_energies(tmp_path):
    """Every whitening solved on torch's MKL, then on SciPy's OpenBLAS (the cache a first run wrote,
    its solve choices set to each): fp64 SCF and E(corr) to 1e-10 Eh of each other, fp32 E(corr)
    within the fp32 envelope (2e-7 Eh); each record names the library that solved."""
    cache = tmp_path / "cache"
    env = {"DFMP2_CACHE_DIR": str(cache)}
    records = {}
    first = run_cli(tmp_path, "--precision", "fp64", env=env)
    assert first["cpu_configuration"]["gemm"]["solves"]["fp64"]["flops_by_library"]
    path = first["cpu_configuration"]["gemm"]["cache"]
    held = json.load(open(path))
    solve_keys = [key for key in held["choices"] if key.endswith("/solve")]
    assert any("/fp64/" in key for key in solve_keys)
    for library in cpu_config.SOLVE_LIBRARIES:
        for key in solve_keys:
            held["choices"][key]["library"] = library
        open(path, "w").write(json.dumps(held))
        records[library] = {p: run_cli(tmp_path, "--precision", p, env=env) for p in ("fp64", "fp32")}
        for p in ("fp64", "fp32"):  # the SCF's whitening (fp64 either way) is most of the solves' flops
            assert records[library][p]["cpu_configuration"]["gemm"]["solves"]["fp64"]["library"] == library
    mkl, other = records["mkl"], records["scipy-openblas"]
    assert abs(mkl["fp64"]["e_hf"] - other["fp64"]["e_hf"]) < 1e-10
    assert abs(mkl["fp64"]["e_corr"] - other["fp64"]["e_corr"]) < 1e-10
    assert abs(mkl["fp32"]["e_corr"] - other["fp32"]["e_corr"]) < 2e-7
