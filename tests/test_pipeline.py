"""Pipeline mechanics: memory plan, blocking, the disk store, orbital selection, the metric."""

import os
from dataclasses import replace

import numpy as np
import pytest
import torch

from conftest import converged_rhf
from dfmp2 import DFMP2, InputError
from dfmp2.kernels import get_backend
from dfmp2.linalg import factor_metric, whiten
from dfmp2.util.system_memory import MB
from dfmp2.run.memory import TensorSizes, default_hints, plan_memory
from dfmp2.mp2.orbitals import active_orbitals

SIZES = TensorSizes(nao=114, spaces=[(15, 93)], naux=420, largest_shell=11, itemsize=8)


def test_plan_memory_storage_follows_the_budget():
    roomy = plan_memory(10_000 * MB, SIZES)
    assert roomy.storage == "memory" and roomy.aux_block == SIZES.naux
    tight = plan_memory(int(roomy.minimum * 1.01), SIZES)
    assert tight.storage == "disk"
    assert tight.aux_block < SIZES.naux and tight.occ_block < roomy.occ_block
    with pytest.raises(InputError, match="MB"):
        plan_memory(roomy.minimum - 1, SIZES)


def test_plan_memory_prefers_cache_sized_integral_blocks():
    plan = plan_memory(10_000 * MB, SIZES, replace(default_hints(), aux_block_bytes=16 * 2**20))
    assert SIZES.largest_shell <= plan.aux_block <= 16 * 2**20 // (8 * 114 * 114)


@pytest.mark.parametrize("precision", ["fp64", "fp32"])
def test_disk_store_and_smallest_blocks_give_the_same_energy(precision, tmp_path, arrays_only_budget):
    mf = converged_rhf("ethylene")
    in_memory = DFMP2(mf, frozen=2, precision=precision)
    in_memory.kernel(with_t2=False)  # the plan of the energy alone (a kept t2 is planned for too)
    assert in_memory.result.correlation.plan.storage == "memory"
    minimum = in_memory.result.correlation.plan.minimum
    from dfmp2.api.driver import run_mean_field

    tight = run_mean_field(mf, frozen=2, precision=precision, max_memory=minimum * 1.02 / MB,
                           scratch=str(tmp_path))
    plan = tight.correlation.plan
    assert plan.storage == "disk"
    assert plan.aux_block < tight.correlation.naux and plan.occ_block < tight.correlation.nocc
    assert tight.kernels["pair_energy"] > in_memory.result.kernels["pair_energy"]
    assert abs(tight.e_corr - in_memory.e_corr) < 1e-10
    assert list(tmp_path.iterdir()) == []  # the scratch file is gone


def test_budget_too_small_is_an_input_error(arrays_only_budget):
    mf = converged_rhf("water")
    pt = DFMP2(mf)
    pt.max_memory = 0.05  # MB
    with pytest.raises(InputError, match="needs at least"):
        pt.kernel()


def test_active_orbitals():
    occ = np.array([2, 2, 2, 0, 0, 0])
    o, v, n = active_orbitals(occ, None)
    assert list(o) == [0, 1, 2] and list(v) == [3, 4, 5] and n == 0
    o, v, n = active_orbitals(occ, 2)
    assert list(o) == [2] and n == 2
    o, v, n = active_orbitals(occ, [0, 5])
    assert list(o) == [1, 2] and list(v) == [3, 4] and n == 2
    for bad in (4, -1, [7], "x"):
        with pytest.raises(InputError):
            active_orbitals(occ, bad)
    with pytest.raises(InputError, match="no active occupied"):
        active_orbitals(occ, 3)


def test_cholesky_whitening_reproduces_the_inverse_metric():
    backend = get_backend("cpu", "fp64")
    rng = np.random.default_rng(7)
    a = rng.standard_normal((40, 40))
    metric = torch.from_numpy(a @ a.T + 40 * np.eye(40))
    x = torch.from_numpy(rng.standard_normal((25, 40)))
    factor = factor_metric(backend, metric)
    assert factor.kind == "cholesky"
    b = whiten(backend, factor, x)
    expected = x @ torch.linalg.solve(metric, x.T)  # X J^-1 X^T
    assert torch.allclose(b @ b.T, expected, atol=1e-10)


def test_singular_metric_falls_back_to_eigen_and_matches_pseudo_inverse():
    backend = get_backend("cpu", "fp64")
    rng = np.random.default_rng(3)
    a = rng.standard_normal((30, 20))
    metric = torch.from_numpy(a @ a.T)  # rank 20 of 30
    x = torch.from_numpy(rng.standard_normal((12, 20)) @ a.T)  # in the range of the metric
    factor = factor_metric(backend, metric)
    assert factor.kind == "eigen" and factor.nkept == 20 and factor.ndropped == 10
    b = whiten(backend, factor, x)
    assert torch.isfinite(b).all()
    expected = x @ torch.linalg.pinv(metric, hermitian=True) @ x.T
    assert torch.allclose(b @ b.T, expected, atol=1e-8)


def test_nki_metric_factorised_from_the_fp64_metric():
    """A backend without fp64 (NKI) factorises PySCF's fp64 (P|Q) on the host: the L it whitens
    with is the fp64 Cholesky factor rounded once, not a factor of an fp32-rounded metric.
    The metric here has condition number 1e10, like diffuse auxiliary sets."""
    backend = get_backend("trn1", simulate=True)
    rng = np.random.default_rng(11)
    q, _ = np.linalg.qr(rng.standard_normal((200, 200)))
    metric = (q * np.logspace(1, -9, 200)) @ q.T
    metric = (metric + metric.T) / 2
    factor = factor_metric(backend, metric)
    assert factor.kind == "cholesky" and backend.calls["host:cholesky"] == 1
    assert factor.matrix.dtype == torch.float32
    np.testing.assert_array_equal(factor.matrix.numpy(), np.linalg.cholesky(metric).astype(np.float32))
    # what rounding the metric to fp32 first would have done: its smallest eigenvalue (1e-9)
    # moves by more than itself
    rounded = metric.astype(np.float32).astype(np.float64)
    assert abs(np.linalg.eigvalsh(rounded).min() - 1e-9) > 1e-9


def _process_io():
    fields = dict(line.split(": ") for line in open("/proc/self/io", encoding="ascii").read().split("\n") if line)
    return int(fields["rchar"]), int(fields["wchar"])


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs Linux /proc/self/io")
def test_out_of_core_writes_each_byte_at_most_twice(tmp_path, arrays_only_budget):
    """Scratch traffic of a disk run: the transform writes each (ia|P) block once, whitening
    writes B once (<= 2x the tensor, counted by the store and by the kernel's write() bytes:
    no HDF5 chunk is rewritten); reads: (ia|P) once, whitened slab by slab as the pair stage
    reaches it, plus the B_J streams (was ~100x with aux-block slices of occupied-row chunks)."""
    from dfmp2.api.driver import run_mean_field
    from dfmp2.util.system_memory import MB

    mf = converged_rhf("ethylene")
    roomy = run_mean_field(mf, frozen=2)
    r0, w0 = _process_io()
    tight = run_mean_field(mf, frozen=2, max_memory=roomy.correlation.plan.minimum * 1.02 / MB,
                           scratch=str(tmp_path))
    r1, w1 = _process_io()
    io, tensor = tight.correlation.io, tight.correlation.io["tensor_bytes"]
    assert tight.correlation.plan.storage == "disk" and abs(tight.e_corr - roomy.e_corr) < 1e-10
    assert tensor <= io["bytes_written"] <= 2 * tensor
    assert w1 - w0 <= 2 * tensor * 1.1 + 64 * 1024  # what reached write(): no rewrite (+ HDF5 headers)
    # the metric's arrays take most of this smallest budget, leaving tiny slabs: reads stay a few
    # times the tensor (the target formula is checked where the budget is mostly for B, below)
    assert io["bytes_read"] <= 2 * tensor and r1 - r0 <= 2 * tensor * 1.1 + 2 * MB
    record = tight.as_dict()
    assert record["io"] == io and record["memory"]["slab_rows"] >= tight.correlation.plan.occ_block


def test_every_backend_implements_the_protocol():
    """TorchBackend and NkiBackend both satisfy kernels.protocol.Backend (no NKI-only hooks
    called on the torch backend), and their plan hints say what each prefers."""
    from dfmp2.kernels.nki.backend import NkiBackend
    from dfmp2.kernels.protocol import Backend
    from dfmp2.kernels.torch.backend import TorchBackend

    cpu, trn = TorchBackend("cpu", "fp64"), NkiBackend("trn2", simulate=True)
    # (isinstance with a runtime-checkable Protocol only checks that the names exist: every
    # protocol method is compared with each backend's own, its parameters name for name)
    assert assert_implements(Backend, cpu) and assert_implements(Backend, trn)
    cpu_hints, trn_hints = cpu.plan_hints(93, 420), trn.plan_hints(93, 420)
    assert cpu_hints.pair_scratch_bytes(4, 93) > 0 and trn_hints.pair_scratch_bytes(4, 93) == 0
    assert trn_hints.aux_block_bytes > cpu_hints.aux_block_bytes and trn_hints.pair_rows > cpu_hints.pair_rows


def assert_implements(protocol, obj) -> bool:
    """Every method and attribute `protocol` declares exists on `obj`, each method with the
    protocol's parameters in order, with the same names and defaults (extra trailing ones
    with defaults allowed)."""
    import inspect

    cls = type(obj)
    declared = {name for name in vars(protocol) if not name.startswith("_")} | set(
        getattr(protocol, "__annotations__", {}))
    assert declared, protocol
    for name in sorted(declared):
        assert hasattr(obj, name), f"{cls.__name__} lacks {protocol.__name__}.{name}"
        wanted = vars(protocol).get(name)
        if not callable(wanted):
            continue
        mine = inspect.signature(getattr(obj, name)).parameters  # bound: without self
        theirs = dict(list(inspect.signature(wanted).parameters.items())[1:])
        got = list(mine.values())[:len(theirs)]
        assert [(p.name, p.default) for p in got] == [(p.name, p.default) for p in theirs.values()], \
            f"{cls.__name__}.{name}{inspect.signature(getattr(obj, name))} is not {protocol.__name__}.{name}" \
            f"{inspect.signature(wanted)}"
        assert all(p.default is not inspect.Parameter.empty or p.kind is p.VAR_KEYWORD
                   for p in list(mine.values())[len(theirs):]), f"{cls.__name__}.{name} needs more arguments"
    return True


@pytest.mark.parametrize("fraction", [0.25, 0.8])
def test_out_of_core_reads_within_the_target(fraction, arrays_only_budget):
    """Budgets that hold the smallest blocks plus a fraction of the tensor (synthetic problem:
    B, not the metric, is what does not fit): reads <= tensor x (1 + tensor / (budget / 2)),
    writes <= 2x the tensor, same energy as in memory."""
    from dfmp2.kernels import get_backend
    from dfmp2.mp2.pipeline import dfmp2_energy
    from dfmp2.rng.synthetic import SyntheticIntegrals, synthetic_orbitals

    sizes = (240, 80, 240)
    coeff, energies, occupations = synthetic_orbitals(*sizes[:2], 0)
    roomy = dfmp2_energy(get_backend("cpu"), SyntheticIntegrals(*sizes, 0), coeff, energies, occupations)
    tensor = roomy.io["tensor_bytes"]
    budget = roomy.plan.minimum + fraction * tensor
    tight = dfmp2_energy(get_backend("cpu"), SyntheticIntegrals(*sizes, 0), coeff, energies, occupations,
                         max_memory=budget / MB)
    assert tight.plan.storage == "disk" and roomy.plan.storage == "memory"
    assert tight.io["bytes_read"] <= tensor * (1 + tensor / (budget / 2))
    assert tight.io["bytes_written"] <= 2 * tensor
    assert abs(tight.e_corr - roomy.e_corr) < 1e-10


@pytest.mark.parametrize("storage", ["memory", "checkpoint"])
def test_the_metric_is_factorised_once_per_run(storage, monkeypatch, tmp_path):
    """Step 1 (J = L L^T) once per run, shared by the whitening of B and the three-index density of a
    gradient's run (with_gamma); where B comes from a checkpoint, once, for the density; the energy and
    the density those runs give are the same."""
    from dfmp2.api.driver import run_mean_field
    from dfmp2.kernels.torch.backend import TorchBackend
    from dfmp2.run.settings import Settings

    made, cholesky = [], TorchBackend.cholesky
    monkeypatch.setattr(TorchBackend, "cholesky", lambda self, metric: made.append(metric.shape) or cholesky(self, metric))
    mf = converged_rhf("water")
    settings = Settings(precision="fp64", with_rdm1=True, with_gamma=True,
                        checkpoint=str(tmp_path / "ck") if storage == "checkpoint" else None)
    first = run_mean_field(mf, settings)
    assert len(made) == 1
    if storage == "checkpoint":  # the second run reads B back: one factorisation, for the density
        again = run_mean_field(mf, settings)
        assert len(made) == 2 and again.e_corr == first.e_corr
        assert np.array_equal(again.correlation.gamma.gamma_aux, first.correlation.gamma.gamma_aux)
