"""The real command line, run as a subprocess: `python -m dfmp2.app.cli ...`.

Exit status: 0 success, 2 bad input, 1 runtime failure; errors are exactly one line on
stderr starting with "dfmp2: error:", never a traceback (unless --debug), and a failed run
leaves no JSON file (nor a temporary file) behind.

Each subprocess pays ~1.5 s of torch/PySCF import, so the runs are started together in a
small thread pool from module-scoped fixtures and shared between tests.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import pytest
import torch

import dfmp2
from conftest import converged_rhf, pyscf_reference

ROOT = Path(__file__).resolve().parents[1]
WATER = ROOT / "examples" / "water.xyz"
BENZENE = ROOT / "examples" / "benzene.xyz"
METHYL = ROOT / "examples" / "methyl.xyz"
CUDA = torch.cuda.is_available()
TIMEOUT_S = 600
WORKERS = max(1, min(8, os.cpu_count() or 1))

JSON_KEYS = {"e_hf", "e_corr", "e_corr_os", "e_corr_ss", "e_scs", "e_tot", "nbasis", "nocc",
             "nvir", "naux", "nfrozen", "basis", "auxbasis", "scf", "device", "precision",
             "timings", "version", "kernels", "backend", "reference", "spin_square", "e_corr_singles",
             "transform"}

WATER_LINES = ["O   0.000000   0.000000   0.117300",
               "H   0.000000   0.757200  -0.469200",
               "H   0.000000  -0.757200  -0.469200"]


def xyz(count, *atom_lines, comment="water"):
    return "\n".join([str(count), comment, *atom_lines]) + "\n"


def dfmp2_cli(*args, cwd):
    """Run `python -m dfmp2.app.cli ARGS` in `cwd`; returns the CompletedProcess (text mode)."""
    return subprocess.run([sys.executable, "-m", "dfmp2.app.cli", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=TIMEOUT_S,
                          stdin=subprocess.DEVNULL)


def run_all(jobs):
    """jobs: {name: (args, cwd)} -> {name: CompletedProcess}, a few at a time."""
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        futures = {name: pool.submit(dfmp2_cli, *args, cwd=cwd) for name, (args, cwd) in jobs.items()}
        return {name: future.result() for name, future in futures.items()}


def describe(proc):
    return f"exit {proc.returncode}\n--- stdout:\n{proc.stdout}\n--- stderr:\n{proc.stderr}"


# ----------------------------------------------------------------------------- successful runs

SUCCESS_RUNS = {
    "default": ["run", WATER, "--json", "out.json"],
    "frozen_quiet": ["run", WATER, "--frozen-core", "--quiet", "--json", "out.json"],
    "exact": ["run", WATER, "--scf", "exact", "--json", "out.json"],
    "fp64": ["run", WATER, "--precision", "fp64", "--json", "out.json"],
    "lowercase": ["run", "lower.xyz", "--json", "out.json"],
    "trn1_sim": ["run", WATER, "--device", "trn1", "--simulate", "--json", "out.json"],
    "trn2_sim": ["run", WATER, "--device", "trn2", "--simulate", "--json", "out.json"],
    "trn3_sim": ["run", WATER, "--device", "trn3", "--simulate", "--json", "out.json"],
    "methyl_uhf": ["run", METHYL, "--spin", "1", "--json", "out.json"],
    "methyl_rohf": ["run", METHYL, "--spin", "1", "--reference", "rohf", "--frozen-core", "--json", "out.json"],
    "trn2_sim_fp32_transform": ["run", WATER, "--device", "trn2", "--simulate", "--transform", "fp32",
                                "--json", "out.json"],
}


@dataclass
class Success:
    proc: subprocess.CompletedProcess
    directory: Path
    inputs: set

    @property
    def record(self):
        assert self.proc.returncode == 0, describe(self.proc)
        return json.loads((self.directory / "out.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    dirs = {name: tmp_path_factory.mktemp(f"ok-{name}") for name in SUCCESS_RUNS}
    lower = [line.replace("O", "o", 1).replace("H", "h", 1) for line in WATER_LINES]
    (dirs["lowercase"] / "lower.xyz").write_text(xyz(3, *lower), encoding="utf-8")
    inputs = {name: set(os.listdir(d)) for name, d in dirs.items()}
    procs = run_all({name: (args, dirs[name]) for name, args in SUCCESS_RUNS.items()})
    return {name: Success(procs[name], dirs[name], inputs[name]) for name in SUCCESS_RUNS}


def test_run_succeeds_and_prints_summary(runs):
    run = runs["default"]
    assert run.proc.returncode == 0, describe(run.proc)
    assert "E(corr)" in run.proc.stdout
    assert "Traceback" not in run.proc.stdout + run.proc.stderr
    # the summary shows the same correlation energy as the JSON file (12 decimals printed)
    printed = re.search(r"^\s*E\(corr\)\s+(-?\d+\.\d+)\s+Eh\s*$", run.proc.stdout, re.M)
    assert printed, run.proc.stdout
    assert float(printed.group(1)) == pytest.approx(run.record["e_corr"], abs=1e-11)


def test_run_json_has_all_keys_and_consistent_energies(runs):
    r = runs["default"].record
    missing = JSON_KEYS - set(r)
    assert not missing, f"JSON lacks {sorted(missing)}"
    # every energy against PySCF's DF-RHF (its default JK-fit set, as dfmp2's) and DFMP2 (the
    # MP2-fit set), SCS with Grimme's published scalings (6/5 opposite-spin, 1/3 same-spin)
    # the default run's MP2 step is fp32 GEMMs with fp64 sums: 0.1 uEh (docs/benchmarking.md)
    assert_matches_pyscf(r, mp2_tolerance=1e-7)
    assert r["nocc"] == 5 and r["nfrozen"] == 0
    assert r["nocc"] + r["nvir"] == r["nbasis"] == 24
    assert r["naux"] > r["nbasis"]
    assert r["device"] == "cpu"
    assert r["precision"] == "fp32"
    assert r["basis"] == "cc-pvdz"
    assert r["auxbasis"] == "cc-pvdz-ri"
    assert r["scf"] == "df"
    assert r["version"] == dfmp2.__version__
    assert isinstance(r["backend"], str) and r["backend"]
    assert isinstance(r["kernels"], dict) and sum(r["kernels"].values()) > 0
    assert isinstance(r["timings"], dict) and all(v >= 0 for v in r["timings"].values())


@pytest.mark.parametrize("name", sorted(SUCCESS_RUNS))
def test_successful_run_leaves_only_its_json(runs, name):
    run = runs[name]
    assert run.proc.returncode == 0, describe(run.proc)
    assert set(os.listdir(run.directory)) == run.inputs | {"out.json"}


def test_frozen_core(runs):
    full, frozen = runs["default"].record, runs["frozen_quiet"].record
    assert frozen["nfrozen"] == 1
    assert frozen["nocc"] == 4
    assert frozen["nvir"] == full["nvir"]
    assert frozen["e_hf"] == pytest.approx(full["e_hf"], abs=1e-10)
    assert full["e_corr"] < frozen["e_corr"] < 0  # freezing O 1s removes some correlation


def test_quiet_prints_nothing(runs):
    run = runs["frozen_quiet"]
    assert run.proc.returncode == 0, describe(run.proc)
    assert run.proc.stdout == ""
    assert run.proc.stderr == ""


def test_scf_exact(runs):
    full, exact = runs["default"].record, runs["exact"].record
    assert exact["scf"] == "exact"
    assert full["scf"] == "df"
    assert exact["e_hf"] == pytest.approx(full["e_hf"], abs=1e-4)  # JK-fit error is ~1e-5 Eh
    assert exact["e_hf"] != full["e_hf"]  # ... but it is a different calculation


def assert_matches_pyscf(r, mp2_tolerance):
    """Every energy of the run record r against PySCF's DF-RHF (its default JK-fit set, as dfmp2's)
    and DFMP2 (the MP2-fit set), SCS with Grimme's published scalings (6/5 opposite-spin, 1/3
    same-spin): E(SCF) to 1e-8 Eh, the MP2 energies to mp2_tolerance."""
    mf = converged_rhf("water", atom=str(WATER), scf_mode="df")
    e_corr, e_os, e_ss = pyscf_reference(mf, "cc-pvdz-ri")
    assert abs(r["e_hf"] - mf.e_tot) < 1e-8
    for key, value in (("e_corr", e_corr), ("e_corr_os", e_os), ("e_corr_ss", e_ss), ("e_tot", mf.e_tot + e_corr),
                       ("e_scs", 1.2 * e_os + e_ss / 3)):
        assert abs(r[key] - value) < mp2_tolerance, key


def test_fp64_run_matches_pyscf(runs):
    strict = runs["fp64"].record
    assert strict["precision"] == "fp64"
    assert_matches_pyscf(strict, mp2_tolerance=1e-8)


def test_fp32_default_matches_fp64(runs):
    default, strict = runs["default"].record, runs["fp64"].record
    assert default["precision"] == "fp32"
    # the MP2 step's GEMM precision leaves the SCF alone (its builds keep the SCF's own policy)
    assert abs(default["e_hf"] - strict["e_hf"]) < 1e-10
    assert abs(default["e_corr"] - strict["e_corr"]) < 1e-7
    assert default["e_corr"] != strict["e_corr"]  # ... but the GEMMs did run in fp32


def test_element_symbols_in_any_case(runs):
    lower, full = runs["lowercase"].record, runs["default"].record
    assert lower["formula"] == "H2O"
    assert abs(lower["e_hf"] - full["e_hf"]) < 1e-10
    assert abs(lower["e_corr"] - full["e_corr"]) < 1e-10


# ----------------------------------------------------------------------------- failures

@dataclass
class Case:
    id: str
    args: list  # "{water}" / "{benzene}" are replaced by the example files
    code: int = 2
    needles: tuple = ()  # substrings (str) or regexes (re.Pattern) the error line must contain
    absent: tuple = ()  # substrings the error line must not contain
    files: dict = field(default_factory=dict)  # name -> text, written into the case directory
    json: bool = True  # add --json out.json


GOOD = WATER_LINES
CASES = [
    Case("missing-file", ["run", "nosuch.xyz"], needles=("nosuch.xyz",)),
    Case("more-atoms-than-declared", ["run", "bad.xyz"], needles=("bad.xyz", "line 1"),
         files={"bad.xyz": xyz(2, *GOOD)}),
    Case("fewer-atoms-than-declared", ["run", "bad.xyz"], needles=("bad.xyz", "line 1"),
         files={"bad.xyz": xyz(4, *GOOD)}),
    Case("non-integer-count", ["run", "bad.xyz"], needles=("bad.xyz", "line 1", "three"),
         files={"bad.xyz": xyz("three", *GOOD)}),
    Case("empty-file", ["run", "bad.xyz"], needles=("bad.xyz",), files={"bad.xyz": ""}),
    Case("unknown-element", ["run", "bad.xyz"], needles=("bad.xyz", "line 3", "Xx"),
         files={"bad.xyz": xyz(3, "Xx 0.0 0.0 0.1173", GOOD[1], GOOD[2])}),
    Case("non-numeric-coordinate", ["run", "bad.xyz"], needles=("line 4", "0.75x72"),
         files={"bad.xyz": xyz(3, GOOD[0], "H 0.0 0.75x72 -0.4692", GOOD[2])}),
    Case("too-few-fields", ["run", "bad.xyz"], needles=("line 5",),
         files={"bad.xyz": xyz(3, GOOD[0], GOOD[1], "H 0.0 -0.7572")}),
    Case("molecule-is-a-directory", ["run", "."], needles=("directory",)),
    Case("unknown-basis", ["run", "{water}", "--basis", "nosuchbasis"], needles=("nosuchbasis",)),
    Case("unknown-auxbasis", ["run", "{water}", "--auxbasis", "nosuch-ri"], needles=("nosuch-ri",)),
    Case("no-electrons-left", ["run", "{water}", "--charge", "20"], needles=("electron",)),
    Case("odd-electron-count", ["run", "{water}", "--charge", "1", "--spin", "0"],
         needles=("odd electron count (9)", "--spin")),
    Case("impossible-spin", ["run", "{water}", "--spin", "1"], needles=("spin", "10 electrons")),
    Case("rhf-for-an-open-shell", ["run", "{water}", "--spin", "2", "--reference", "rhf"],
         needles=("RHF", "closed shell", "2S = 2")),
    Case("unknown-reference", ["run", "{water}", "--spin", "2", "--reference", "ghf"], needles=("ghf", "rohf")),
    Case("odd-electrons-with-spin-0", ["run", "{methyl}", "--spin", "0"], needles=("odd electron count", "--spin")),
    Case("impossible-spin-for-radical", ["run", "{methyl}", "--spin", "2"], needles=("2S 2", "--spin", "9 electrons")),
    Case("impossible-fragment-line", ["run", "bad.xyz"], needles=("bad.xyz, line 7", "fragment 2 ('0 1')", "1 electrons"),
         files={"bad.xyz": "4\nwater and H\n" + "\n".join(GOOD) + "\n--\n0 1\nH 0.0 0.0 3.0\n"}),
    Case("fragment-line-disagrees", ["run", "bad.xyz", "--charge", "1"], needles=("bad.xyz, line 3", "--charge 1", "'0 1'"),
         files={"bad.xyz": "3\nwater\n0 1\n" + "\n".join(GOOD) + "\n"}),
    Case("bsse-empty", ["run", "{water}", "--bsse", ""], needles=("--bsse is empty",)),
    Case("bracket-with-separators", ["run", "{water}", "--basis", "cc-pv[d,t]z"], needles=("[dt]", "separators")),
    Case("scf-extrapolation-with-one-basis", ["run", "{water}", "--scf-extrapolation", "exponential"],
         needles=("--scf-extrapolation exponential", "one basis")),
    Case("unknown-device", ["run", "{water}", "--device", "tpu"], needles=("tpu",)),
    Case("simulate-on-cpu", ["run", "{water}", "--simulate"], needles=("--simulate",)),
    Case("trainium-fp64", ["run", "{water}", "--device", "trn1", "--simulate", "--precision", "fp64"],
         needles=("trn1", "fp64")),
    Case("unknown-precision", ["run", "{water}", "--precision", "fp16"], needles=("fp16",)),
    Case("unknown-nki-api", ["run", "{water}", "--device", "trn2", "--simulate", "--nki-api", "0.9"],
         needles=("0.9", "--nki-api")),
    Case("unsupported-nki-on-trn1", ["run", "{water}", "--device", "trn1", "--simulate", "--nki-api", "0.6"],
         needles=("trn1", "nki 0.6", "AWS does not support")),
    Case("unsupported-nki-on-trn3", ["run", "{water}", "--device", "trn3", "--simulate", "--nki-api", "0.2"],
         needles=("trn3", "nki 0.2", "AWS does not support", "SDK 2.29")),
    Case("nki-api-without-simulate", ["run", "{water}", "--device", "trn2", "--nki-api", "0.3"],
         needles=("--nki-api", "--simulate")),
    Case("transform-on-cpu", ["run", "{water}", "--transform", "fp32"], needles=("--transform", "cpu", "fp64")),
    Case("unknown-transform", ["run", "{water}", "--device", "trn2", "--simulate", "--transform", "bf16"],
         needles=("bf16", "exact", "fp32")),
    # water/cc-pVDZ fits in ~0.2 MB, so 1 MB is "too small" only for a larger molecule
    Case("max-memory-too-small", ["run", "{benzene}", "--max-memory", "1", "--scf-max-cycle", "1"],
         needles=(re.compile(r"memory", re.I), "MB")),
    Case("max-memory-negative", ["run", "{water}", "--max-memory", "-5"], needles=("max-memory",)),
    Case("charge-not-an-integer", ["run", "{water}", "--charge", "abc"], needles=("abc",)),
    Case("scf-max-cycle-zero", ["run", "{water}", "--scf-max-cycle", "0"],
         needles=("scf-max-cycle",)),
    Case("scratch-missing", ["run", "{water}", "--scratch", "nosuchdir"], needles=("nosuchdir",)),
    Case("json-directory-missing", ["run", "{water}", "--json", "nodir/out.json"],
         needles=("nodir",), json=False),
    Case("json-is-a-directory", ["run", "{water}", "--json", "sub"], needles=("sub",),
         files={"sub/keep": ""}, json=False),
    # issue 21, found before the SCF: the cases with --scf-max-cycle 1 would fail with exit 1 (SCF
    # not converged) if the SCF ran before the check
    Case("atoms-at-one-position", ["run", "bad.xyz", "--scf-max-cycle", "1"],
         needles=("bad.xyz", "lines 4 and 5", "same position"), files={"bad.xyz": xyz(3, GOOD[0], GOOD[1], GOOD[1])}),
    Case("atoms-too-close", ["run", "bad.xyz", "--scf-max-cycle", "1"],
         needles=("lines 4 and 5", "0.1 Angstrom apart"),
         files={"bad.xyz": xyz(3, GOOD[0], GOOD[1], "H 0.0 0.7572 -0.3692")}),
    Case("more-electrons-than-orbitals", ["run", "{water}", "--charge", "-40", "--scf-max-cycle", "1"],
         needles=("25 alpha electrons", "24 orbitals", "more than they hold")),
    Case("no-virtual-orbital-left", ["run", "{water}", "--charge", "-38", "--scf-max-cycle", "1"],
         needles=("24 alpha electrons", "none is left virtual")),
    Case("no-beta-electron", ["run", "h2.xyz", "--spin", "2"], needles=("2S = 2", "no beta electron"),
         absent=("frozen",), files={"h2.xyz": xyz(2, "H 0 0 0", "H 0 0 0.74")}),
    Case("max-memory-huge", ["run", "{water}", "--max-memory", "1e305"], needles=("--max-memory", "1e+305")),
    Case("max-memory-nan", ["run", "{water}", "--max-memory", "nan"], needles=("--max-memory",)),
    Case("c-os-not-finite", ["run", "{water}", "--xc", "b3lyp", "--c-os", "nan", "--c-ss", "0.3"],
         needles=("--c-os", "finite")),
    Case("c-ss-not-finite", ["run", "{water}", "--xc", "b3lyp", "--c-os", "0.5", "--c-ss", "inf"],
         needles=("--c-ss", "finite")),
    Case("rank-timeout-negative", ["run", "{water}", "--rank-timeout", "-1"], needles=("--rank-timeout",)),
    Case("rank-timeout-not-finite", ["run", "{water}", "--rank-timeout", "nan"], needles=("--rank-timeout",)),
    Case("checkpoint-is-a-file", ["run", "{water}", "--checkpoint", "afile", "--scf-max-cycle", "1"],
         needles=("--checkpoint afile", "not a directory"), files={"afile": "mine"}),
    Case("checkpoint-holds-files-but-no-manifest", ["run", "{water}", "--checkpoint", "ck", "--scf-max-cycle", "1"],
         needles=("--checkpoint ck", "manifest", "--checkpoint-allow-other-files"),
         files={"ck/B_mine.h5": "x", "ck/.B_x": "y", "ck/pairs7.journal": "z"}),
    Case("checkpoint-file-looks-like-dfmp2s", ["run", "{water}", "--checkpoint", "ck", "--checkpoint-allow-other-files",
                                              "--scf-max-cycle", "1"],
         needles=("B_restricted.h5", "not written by dfmp2"), files={"ck/B_restricted.h5": "the user's"}),
    Case("checkpoint-manifest-not-dfmp2s", ["run", "{water}", "--checkpoint", "ck", "--scf-max-cycle", "1"],
         needles=("manifest.json", "not a dfmp2 checkpoint manifest"), files={"ck/manifest.json": '{"a": 1}'}),
    Case("symbol-long-s", ["run", "bad.xyz"], needles=("line 3", "unknown element"),
         files={"bad.xyz": xyz(3, "\u017f 0.0 0.0 0.1173", GOOD[1], GOOD[2])}),  # U+017F upper-cases to S
    Case("symbol-dotless-i", ["run", "bad.xyz"], needles=("line 3", "unknown element"),
         files={"bad.xyz": xyz(3, "\u0131 0.0 0.0 0.1173", GOOD[1], GOOD[2])}),  # U+0131 upper-cases to I
    Case("xyz-line-too-long", ["run", "bad.xyz"], needles=("line 2", "longer than"),
         files={"bad.xyz": "3\n" + "x" * 5000 + "\n" + "\n".join(GOOD) + "\n"}),
    Case("xyz-atom-count-absurd", ["run", "bad.xyz"], needles=("line 1", "at most"),
         files={"bad.xyz": xyz(10**9, *GOOD)}),
    Case("xyz-two-geometries", ["optimize", "bad.xyz"], needles=("optimize takes one molecule",),
         files={"bad.xyz": xyz(3, *GOOD) + xyz(3, *GOOD)}),
    Case("seed-too-large", ["bench", "--shape", "small", "--seed", str(2**64)], needles=("--seed",)),
    Case("seed-negative", ["bench", "--shape", "small", "--seed", "-1"], needles=("--seed",)),
    Case("json-under-a-file", ["run", "{water}", "--json", "afile/j.json", "--scf-max-cycle", "1"],
         needles=("--json afile/j.json",), files={"afile": "x"}, json=False),
    Case("natorbs-directory-missing", ["run", "{water}", "--natorbs", "nodir/n.molden", "--scf-max-cycle", "1"],
         needles=("--natorbs nodir/n.molden", "does not exist")),
    # /proc: a directory where nothing can be created, even by root (Linux)
    Case("json-not-writable", ["run", "{water}", "--json", "/proc/out.json", "--scf-max-cycle", "1"],
         needles=("--json /proc/out.json", "cannot write"), json=False),
    Case("scratch-not-writable", ["run", "{water}", "--scratch", "/proc", "--scf-max-cycle", "1"],
         needles=("--scratch /proc", "cannot write")),
    Case("checkpoint-not-writable", ["run", "{water}", "--checkpoint", "/proc/ck", "--scf-max-cycle", "1"],
         needles=("--checkpoint /proc/ck", "cannot")),
    Case("json-and-natorbs-one-file", ["run", "{water}", "--natorbs", "same.out", "--json", "same.out"],
         needles=("same file",), json=False),
    Case("natorbs-to-stdout", ["run", "{water}", "--natorbs", "-"], needles=("--natorbs -", "only for --json")),
    Case("ecp-name-covers-nothing", ["run", "{water}", "--ecp", "def2-svp"], needles=("--ecp def2-svp", "no ECP")),
    # issue 46 (the second battery): each found before the SCF (one cycle allowed would fail with exit 1)
    Case("coordinate-1e200", ["run", "bad.xyz", "--scf-max-cycle", "1"], needles=("bad.xyz", "line 3", "1e200"),
         files={"bad.xyz": xyz(3, "O 0 0 1e200", GOOD[1], GOOD[2])}),
    Case("coordinate-1e308", ["run", "bad.xyz", "--scf-max-cycle", "1"], needles=("bad.xyz", "line 5", "1e308"),
         files={"bad.xyz": xyz(3, GOOD[0], GOOD[1], "H 1e308 0 0")}),
    Case("json-is-the-input", ["run", "w.xyz", "--json", "w.xyz", "--scf-max-cycle", "1"],
         needles=("--json w.xyz", "input file"), files={"w.xyz": xyz(3, *GOOD)}, json=False),
    Case("natorbs-is-the-input-through-a-link", ["run", "w.xyz", "--natorbs", "link.xyz", "--scf-max-cycle", "1"],
         needles=("--natorbs link.xyz", "input file"), files={"w.xyz": xyz(3, *GOOD)}),
    Case("optimize-output-is-the-input", ["optimize", "w.xyz", "--output", "w.xyz", "--scf-max-cycle", "1"],
         needles=("--output w.xyz", "input file"), files={"w.xyz": xyz(3, *GOOD)}, json=False),
    Case("json-inside-the-checkpoint", ["run", "{water}", "--checkpoint", "ck", "--json", "ck/manifest.json",
                                        "--scf-max-cycle", "1"],
         needles=("--json ck/manifest.json", "checkpoint directory"), json=False),
    Case("json-name-too-long", ["run", "{water}", "--json", "x" * 300 + ".json", "--scf-max-cycle", "1"],
         needles=("--json xxx", "longer than the file system allows"), json=False),
    Case("natorbs-to-dev-stdout", ["run", "{water}", "--natorbs", "/dev/stdout", "--json", "-", "--scf-max-cycle", "1"],
         needles=("--natorbs /dev/stdout", "only for --json"), json=False),
    Case("trajectory-to-dev-stdout", ["optimize", "{water}", "--trajectory", "/dev/stdout", "--json", "-",
                                      "--output", "o.xyz", "--scf-max-cycle", "1"],
         needles=("--trajectory /dev/stdout", "only for --json"), json=False),
    Case("newline-in-a-file-name", ["run", "a\nb.xyz"], needles=("a\\nb.xyz", "no such file")),
    Case("gradient-of-a-range-separated-functional", ["grad", "{water}", "--xc", "wb97x", "--c-os", "1", "--c-ss",
                                                      "0.3", "--scf-max-cycle", "1"],
         needles=("range-separated", "not implemented"), absent=("--scf-backend pyscf",)),
    Case("bench-kernel-size-huge", ["bench", "--kernel", "gemm", "--size", "10000000000", "--device", "trn1",
                                    "--simulate"], needles=("--size", "4096")),
    Case("bench-repeat-unbounded", ["bench", "--shape", "small", "--repeat", "1000000"], needles=("--repeat", "100")),
    # runtime failures: exit status 1
    Case("scf-not-converging", ["run", "{water}", "--scf-max-cycle", "1"], code=1,
         needles=("SCF", "converge")),
    Case("uhf-not-converging", ["run", "{methyl}", "--spin", "1", "--scf-max-cycle", "1"], code=1,
         needles=("UHF SCF", "converge")),
    Case("cuda-without-gpu", ["run", "{water}", "--device", "cuda"], code=1,
         needles=("cuda",)),
    Case("trainium-without-neuron-sdk", ["run", "{water}", "--device", "trn2"], code=1,
         needles=("trn2", "Neuron SDK", "torch_neuronx", "dfmp2[neuron]", "--simulate")),
]
NEEDS_NO_GPU = {"cuda-without-gpu"}
CASE_PARAMS = [
    pytest.param(case, id=case.id, marks=pytest.mark.skipif(
        CUDA, reason="a CUDA GPU is visible: --device cuda would run")) if case.id in NEEDS_NO_GPU
    else pytest.param(case, id=case.id)
    for case in CASES
]


def _case_args(case):
    files = {"{water}": str(WATER), "{benzene}": str(BENZENE), "{methyl}": str(METHYL)}
    args = [files.get(a, a) for a in case.args]
    return args + (["--json", "out.json"] if case.json else [])


def _listing(directory):
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


@pytest.fixture(scope="module")
def failures(request, tmp_path_factory):
    """Run every selected failure case once (concurrently): {id: (proc, dir, listing before)}."""
    selected = {item.callspec.params["case"].id for item in request.session.items
                if hasattr(item, "callspec") and isinstance(item.callspec.params.get("case"), Case)}
    cases = [c for c in CASES if c.id in selected and not (CUDA and c.id in NEEDS_NO_GPU)]
    dirs, before = {}, {}
    for case in cases:
        directory = dirs[case.id] = tmp_path_factory.mktemp(f"bad-{case.id}")
        for name, text in case.files.items():
            (directory / name).parent.mkdir(parents=True, exist_ok=True)
            (directory / name).write_text(text, encoding="utf-8")
        if "link.xyz" in case.args:
            (directory / "link.xyz").symlink_to("w.xyz")
        before[case.id] = _listing(directory)
    procs = run_all({c.id: (_case_args(c), dirs[c.id]) for c in cases})
    return {i: (procs[i], dirs[i], before[i]) for i in procs}


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_failure_is_one_line_with_exit_status(failures, case):
    proc, directory, before = failures[case.id]
    assert proc.returncode == case.code, describe(proc)
    assert "Traceback" not in proc.stdout + proc.stderr, describe(proc)
    assert proc.stdout == "", describe(proc)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, f"expected exactly one line on stderr\n{describe(proc)}"
    assert proc.stderr.endswith("\n")
    line = lines[0]
    assert line.startswith("dfmp2: error:"), line
    assert len(line) > len("dfmp2: error: ")
    for needle in case.needles:
        if isinstance(needle, re.Pattern):
            assert needle.search(line), f"{needle.pattern!r} not in {line!r}"
        else:
            assert needle in line, f"{needle!r} not in {line!r}"
    for needle in case.absent:
        assert needle not in line, f"{needle!r} in {line!r}"
    # no JSON file and no temporary file left behind, nothing created
    assert _listing(directory) == before


def test_debug_shows_traceback(tmp_path):
    (tmp_path / "bad.xyz").write_text(xyz(3, "Xx 0.0 0.0 0.1173", *WATER_LINES[1:]),
                                      encoding="utf-8")
    proc = dfmp2_cli("run", "bad.xyz", "--debug", "--json", "out.json", cwd=tmp_path)
    assert proc.returncode != 0, describe(proc)
    assert "Traceback" in proc.stderr, describe(proc)
    assert "unknown element" in proc.stderr
    assert not (tmp_path / "out.json").exists()


# ----------------------------------------------------------------------------- info, version

def test_info(tmp_path):
    proc = dfmp2_cli("info", cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)
    out = proc.stdout
    assert re.search(r"^\s*cpu\s+usable\b", out, re.M), out
    assert re.search(r"^\s*cuda\s+" + ("usable" if CUDA else "unavailable") + r"\b", out, re.M), out
    for trn in ("trn1", "trn2", "trn3"):
        assert re.search(rf"^\s*{trn}\s+unavailable\s+Neuron SDK missing", out, re.M), out
    assert re.search(r"^torch\s+" + re.escape(torch.__version__) + r"\s*$", out, re.M), out
    pyscf_version = metadata.version("pyscf")
    assert re.search(r"^pyscf\s+" + re.escape(pyscf_version) + r"\s*$", out, re.M), out
    assert re.search(r"^dfmp2\s+" + re.escape(dfmp2.__version__) + r"\s*$", out, re.M), out


def test_version(tmp_path):
    proc = dfmp2_cli("--version", cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)
    match = re.search(r"\b(\d+\.\d+\.\d+)\b", proc.stdout)
    assert match, proc.stdout
    assert match.group(1) == dfmp2.__version__ == metadata.version("dfmp2")
    assert proc.stdout.lower().startswith("dfmp2")


def test_console_script(tmp_path):
    script = Path(sys.executable).parent / "dfmp2"
    if not script.exists():
        pytest.skip(f"no dfmp2 console script next to {sys.executable}")
    proc = subprocess.run([str(script), "--version"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, describe(proc)
    assert dfmp2.__version__ in proc.stdout


@pytest.mark.parametrize("target", ["trn1", "trn2", "trn3"])
def test_simulated_trainium_run(runs, target):
    cpu, trn = runs["default"].record, runs[f"{target}_sim"].record
    assert trn["device"] == target and trn["backend"] == "nki" and trn["simulated"] is True
    assert trn["precision"] == "fp32" and trn["transform"] == "exact" and cpu["transform"] == "fp64"
    assert abs(trn["e_corr"] - cpu["e_corr"]) < 1e-6
    # the metric is factorised once on the host in fp64; the rest runs as NKI kernels
    assert {"trsm_kernel", "ao2mo_kernel", "pair_energy_kernel"} <= set(trn["kernels"])
    assert trn["kernels"]["host:cholesky"] == 1
    assert all(name.endswith("_kernel") or name.startswith(("host:", "device:")) for name in trn["kernels"])
    scf_kernels = ("fitted_jk_kernel", "exact_matmul_kernel")  # the SCF's builds (docs/scf.md)
    assert trn["scf_backend"] == "nki" and set(scf_kernels) <= set(trn["kernels"])
    shapes = {kernel: len(s) for kernel, s in trn["kernel_specializations"].items()}
    assert sum(n for kernel, n in shapes.items() if kernel not in scf_kernels) <= 8  # compile economy
    assert shapes["fitted_jk_kernel"] == 1 and shapes["exact_matmul_kernel"] <= 3
    assert set(trn["modelled_seconds"]) == {"trn1", "trn2", "trn3"} and min(trn["modelled_seconds"].values()) > 0
    # the emulated NKI release (the newest AWS documents for the target) and the calibrated model
    assert trn["nki_api"] == {"trn1": "0.2", "trn2": "0.7", "trn3": "0.7"}[target] and trn["notes"] == []
    for model in trn["modelled"].values():
        assert model["launches"] == sum(n for k, n in trn["kernels"].items() if k.endswith("_kernel"))
        assert model["seconds"] > model["breakdown"]["launch"] > 0
    assert "not a measurement" in trn["modelled_note"]
    assert "model" in trn["modelled_seconds_note"]
    assert "MODEL" in runs[f"{target}_sim"].proc.stdout


def test_simulated_trainium_run_with_plain_fp32_transform(runs):
    """--transform fp32: recorded in the JSON and the summary, no host-side slicing of (mn|P),
    the energy still within 1 uEh of fp64 on water/cc-pVDZ (measured -9e-8 Eh)."""
    cpu, plain = runs["default"].record, runs["trn2_sim_fp32_transform"].record
    assert plain["transform"] == "fp32" and plain["device"] == "trn2"
    assert "host:slice_operands" not in plain["kernels"] and plain["kernels"]["ao2mo_kernel"] >= 1
    assert abs(plain["e_corr"] - cpu["e_corr"]) < 1e-6
    assert "transform fp32" in runs["trn2_sim_fp32_transform"].proc.stdout


@pytest.mark.parametrize("name, reference", [("methyl_uhf", "uhf"), ("methyl_rohf", "rohf")])
def test_open_shell_runs(runs, name, reference):
    """`dfmp2 run examples/methyl.xyz --spin 1` (UHF by default; ROHF-MBPT(2) on request)
    against PySCF's own UHF/ROHF and, for UHF, its DFUMP2 with the same auxiliary basis."""
    from pyscf import df, gto, scf
    from pyscf.mp.dfump2 import DFUMP2

    record = runs[name].record
    assert record["reference"] == reference and record["spin"] == 1
    mol = gto.M(atom=str(METHYL), basis="cc-pvdz", spin=1, verbose=0)
    mf = getattr(scf, reference.upper())(mol).density_fit()
    mf.conv_tol = 1e-11
    mf.kernel()
    assert abs(record["e_hf"] - mf.e_tot) < 1e-8
    assert record["spin_square"] == pytest.approx(mf.spin_square()[0], abs=1e-6)
    stdout = runs[name].proc.stdout
    assert "nocc 5a/4b" in stdout if reference == "uhf" else "nocc 4a/3b (1a/1b frozen)" in stdout
    if reference == "uhf":
        pt = DFUMP2(mf)
        pt.with_df = df.DF(mol, auxbasis="cc-pvdz-ri")
        pt.kernel()
        # the command's default fp32 MP2 (measured 1.1e-8 Eh; in fp64 the same run is 3e-11 from PySCF)
        assert record["precision"] == "fp32" and record["e_corr_singles"] == 0.0
        assert abs(record["e_corr"] - pt.e_corr) < 1e-7
        assert record["nocc"] == [5, 4] and record["nvir"] == [24, 25]
    else:
        assert record["e_corr_singles"] < 0 and "E(corr, singles)" in stdout
        assert record["nfrozen"] == [1, 1]


def test_progress_line_is_rate_limited_with_an_eta():
    """820 pair-energy updates in 2 s redraw the line ~9 times, not 820; the last one always;
    an ETA once a step has run a second; SCF cycles show elapsed time without a total."""
    from dfmp2.app.progress import Progress

    now = [0.0]
    lines = []
    progress = Progress(interval=0.25, clock=lambda: now[0], write=lines.append)
    for done in range(1, 821):
        now[0] += 2.0 / 820
        progress("pair energies", done, 820)
    assert 5 <= progress.redraws <= 12, progress.redraws
    assert "820/820 (100%" in lines[-1]
    assert any("ETA" in line for line in lines)
    now[0] += 1.0
    progress("SCF cycle", 3, None)
    assert lines[-1].startswith("\r  SCF cycle: 3 (0 s)")
