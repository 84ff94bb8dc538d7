"""The benchmarks page generator: tables and a log-scale plot from result files."""

import json
import os
import sys

import pytest

pytest.importorskip("matplotlib")

from conftest import ROOT  # noqa: E402
from dfmp2.bench import run_bench, run_kernel_bench  # noqa: E402
from dfmp2.rng.synthetic import SHAPES  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import make_page  # noqa: E402


def test_page_from_results(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    for name, kwargs in (("cpu_fp64", {}), ("trn1-sim_fp32", {"device": "trn1", "simulate": True})):
        record = run_bench(*SHAPES["small"], repeat=1, **kwargs)
        record["shape"]["name"] = "small"
        (results / f"bench_small_{name}.json").write_text(json.dumps(record))
    peer = {"molecule": "benzene.xyz", "basis": "cc-pvtz", "median_seconds": {"pyscf": 0.5, "dfmp2-fp64": 0.4},
            "median_ratio_pyscf_over_dfmp2": {"dfmp2-fp64": 1.25}, "e_corr": {"pyscf": -0.9, "dfmp2-fp64": -0.9}}
    (results / "peer_pyscf.json").write_text(json.dumps(peer))
    kernel = run_kernel_bench("gemm", 512, "trn1", simulate=True)
    (results / "kernel_trn1_gemm_512.json").write_text(json.dumps(kernel))
    out = tmp_path / "docs" / "benchmarks.md"
    make_page.main(["--results", str(results), "--out", str(out)])
    text = out.read_text()
    assert "| small | 128/16/384 | cpu fp64 |" in text
    assert "trn1 (emulated, exact transform)" in text and "MODEL" in text and "not measurements" in text
    assert "| benzene.xyz / cc-pvtz | PySCF (CPU) | dfmp2-fp64 | 0.400 | 1.25 |" in text
    # the calibrated model's breakdown and the calibration row against the measured trn1 GEMM
    assert "| small | trn1 (nki 0.2) | exact | trn1 |" in text and "calibrated MODEL" in text
    assert "| gemm | 512 | 512 x 512 x 512 | trn1 | 0.2 |" in text and "| 1.3 | 1.00 |" in text
    png = tmp_path / "docs" / "benchmarks_time.png"
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
