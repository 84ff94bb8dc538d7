"""The benchmarks page generator: tables and a log-scale plot from result files."""

import json
import os
import sys

import pytest

pytest.importorskip("matplotlib")

from conftest import ROOT  # noqa: E402
from dfmp2.app.bench import run_bench, run_kernel_bench  # noqa: E402
from dfmp2.rng.synthetic import SHAPES  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import make_page  # noqa: E402


def test_page_from_results(tmp_path):
    """The page renders what the result files hold: every figure checked below is taken from the
    records written here, never a constant (in particular not the model's calibration figures)."""
    results = tmp_path / "results"
    results.mkdir()
    records = {}
    for name, kwargs in (("cpu_fp64", {}), ("trn1-sim_fp32", {"device": "trn1", "simulate": True})):
        record = run_bench(*SHAPES["small"], repeat=1, **kwargs)
        record["shape"]["name"] = "small"
        records[name] = record
        (results / f"bench_small_{name}.json").write_text(json.dumps(record))
    peer = {"molecule": "benzene.xyz", "basis": "cc-pvtz", "median_seconds": {"pyscf": 0.5, "dfmp2-fp64": 0.4},
            "median_ratio_pyscf_over_dfmp2": {"dfmp2-fp64": 1.25}, "e_corr": {"pyscf": -0.9, "dfmp2-fp64": -0.9}}
    (results / "peer_pyscf.json").write_text(json.dumps(peer))
    kernel = run_kernel_bench("gemm", 512, "trn1", simulate=True)
    # a published figure of our choosing (not the calibration's 1.3 ms): the page must show the
    # file's figure and ratio, whatever they are
    kernel["published_trn1_ms"] = 3.9
    kernel["model_over_published"] = kernel["modelled"]["seconds"] * 1e3 / 3.9
    (results / "kernel_trn1_gemm_512.json").write_text(json.dumps(kernel))
    out = tmp_path / "docs" / "benchmarks.md"
    make_page.main(["--results", str(results), "--out", str(out)])
    text = out.read_text()

    cpu = records["cpu_fp64"]
    assert (f"| small | 128/16/384 | cpu fp64 | {cpu['total_seconds']:.3f} | "
            f"{cpu['stages']['pair_energies']['tflops']:.3f} |") in text
    assert f"| {cpu['e_corr']:.10f} |" in text
    assert "trn1 (emulated, exact transform)" in text and "MODEL" in text and "not measurements" in text
    assert (f"| benzene.xyz / cc-pvtz | PySCF (CPU) | dfmp2-fp64 | {peer['median_seconds']['dfmp2-fp64']:.3f} | "
            f"{peer['median_ratio_pyscf_over_dfmp2']['dfmp2-fp64']:.2f} |") in text
    # the calibrated model's breakdown of the emulated run, from its record
    model = records["trn1-sim_fp32"]["modelled"]["trn1"]
    assert f"| small | trn1 (nki 0.2) | exact | trn1 | {model['seconds']:.4f} |" in text and "calibrated MODEL" in text
    # the kernel row: the record's modelled parts and its published figure and ratio
    parts = kernel["modelled"]["breakdown"]
    assert (f"| gemm | 512 | 512 x 512 x 512 | trn1 | 0.2 | {kernel['modelled']['seconds'] * 1e3:.3f} | "
            f"{parts['launch'] * 1e3:.3f} | {parts['host_transfer'] * 1e3:.3f} | {parts['device'] * 1e3:.3f} | "
            f"3.9 | {kernel['model_over_published']:.2f} |") in text
    png = tmp_path / "docs" / "benchmarks_time.png"
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
