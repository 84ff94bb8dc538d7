"""The benchmark harness (benchmarks/harness.py): a figure taken beside other work is refused,
the contender's own CPU time is not counted against it, the contenders alternate, and each is
timed at its fastest BLAS setting (issue 46). No test here depends on how fast anything is: the
processes timed sleep or spin, and only who used the CPU is asserted."""

import os
import subprocess
import sys
import time

import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import harness  # noqa: E402

SLEEP = [sys.executable, "-c", "import time; time.sleep(1.5)"]
SPIN = [sys.executable, "-c", "import time\nend = time.process_time() + 1.0\nwhile time.process_time() < end: pass"]


@pytest.fixture
def busy_loop():
    """Another process spinning on a core beside the timed runs."""
    loop = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    time.sleep(0.3)
    yield loop
    loop.kill()
    loop.wait()


def test_a_busy_machine_refuses_the_figure(tmp_path, busy_loop):
    """A busy loop beside a timed run: BusyMachine naming the share of a core the others used,
    and the result file is not written."""
    bench = harness.Harness(rounds=1, warmup=0)
    with pytest.raises(harness.BusyMachine, match=r"other processes used \d+% of a core"):
        bench.measure("sleeper", 1, lambda: bench.process(SLEEP))
    with pytest.raises(harness.BusyMachine):
        bench.write(tmp_path / "result.json", {"molecule": "none"})
    assert not (tmp_path / "result.json").exists()
    assert bench.runs[0].other_fraction > 0.5  # (the loop had a core to itself: about 1.0)


def test_a_warm_up_beside_other_work_is_not_refused(busy_loop):
    """Round 0 is discarded: it is measured, not judged."""
    bench = harness.Harness(rounds=1, warmup=1)
    run = bench.measure("sleeper", 0, lambda: bench.process(SLEEP))
    assert run.other_fraction > 0.5 and bench.refused is None and bench.runs == []


def test_the_contenders_own_cpu_is_not_counted_as_other_work():
    """A contender that spins for a second: its CPU time comes from wait4 and is subtracted, so
    that the others' share stays near zero on a quiet machine (well under the spin's)."""
    bench = harness.Harness(rounds=1, warmup=0, busy_fraction=1.0)
    run = bench.measure("spinner", 1, lambda: bench.process(SPIN))
    assert run.cpu_seconds >= 0.9
    assert run.other_cpu_seconds < 0.5 * run.cpu_seconds, run


def test_contenders_alternate_and_each_round_is_recorded():
    order = []

    def contender(name):
        def call():
            order.append(name)
            return 0.0, name
        return call

    bench = harness.Harness(rounds=3, warmup=1, busy_fraction=1.0)
    timed = bench.alternate({"a": contender("a"), "b": contender("b")})
    assert order == ["b", "a", "a", "b", "b", "a", "a", "b"]  # warm-up, then reversed every other round
    assert [len(timed[n]) for n in "ab"] == [3, 3] and len(bench.runs) == 6
    record = bench.record()
    assert record["harness"]["busy_fraction"] == 1.0 and len(record["runs"]) == 6
    assert {"cpu", "cores", "avx2"} <= set(record["machine"])


def test_each_contender_gets_its_fastest_blas_setting(tmp_path):
    """Two settings, one of which slows the contender down: the fast one is chosen, every
    setting's times are kept, and the probe reports numpy's BLAS under the chosen one."""
    settings = {"slow": {"BENCH_DELAY": "1.0"}, "fast": {"BENCH_DELAY": "0.0"}}
    command = [sys.executable, "-c", "import os, time; time.sleep(0.2 + float(os.environ['BENCH_DELAY']))"]
    bench = harness.Harness(rounds=1, warmup=0, busy_fraction=1.0, blas_settings=settings)
    chosen = bench.choose_blas({"sleeper": (command, None, None)})
    assert chosen["sleeper"]["BENCH_DELAY"] == "0.0" and bench.blas["sleeper"]["setting"] == "fast"
    assert set(bench.blas["sleeper"]["trials"]) == {"slow", "fast"}
    assert bench.blas["sleeper"]["trials"]["slow"][0] > bench.blas["sleeper"]["trials"]["fast"][0]
    assert any(pool.get("internal_api") == "openblas" for pool in bench.blas["sleeper"]["probe"]["threadpools"])


def test_a_contender_with_one_setting_runs_no_trial():
    """Nothing to choose: the contender is not run before its timed rounds (a 700 s contender
    would otherwise run once more), and the record says which setting it ran with."""
    calls = []
    bench = harness.Harness(rounds=2, warmup=0, busy_fraction=1.0)
    chosen = bench.choose({"one": {"only": lambda: calls.append("one") or (0.0, None)},
                           "two": {"a": lambda: calls.append("two") or (0.0, None),
                                   "b": lambda: calls.append("two") or (0.0, None)}}, rounds=2)
    assert calls.count("one") == 0 and calls.count("two") == 4
    assert chosen["one"] == ("only", {"only": []}) and chosen["two"][0] in ("a", "b")


def test_bytecode_is_cached_for_every_contender():
    env = harness.bench_environment({"OPENBLAS_CORETYPE": None}, base={"PYTHONDONTWRITEBYTECODE": "1",
                                                                      "OPENBLAS_CORETYPE": "Haswell"})
    assert "PYTHONDONTWRITEBYTECODE" not in env and "OPENBLAS_CORETYPE" not in env
    assert env["PYTHONPYCACHEPREFIX"] == harness.PYCACHE


def test_a_benchmark_script_refuses_a_busy_machine(tmp_path, busy_loop):
    """bench_whole_job.py as typed, beside a busy loop: exit status 3, the reason on stderr, no
    result file."""
    (tmp_path / "h2.xyz").write_text("2\nH2\nH 0 0 0\nH 0 0 0.74\n")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_whole_job.py"),
                           str(tmp_path / "h2.xyz"), "--basis", "sto-3g", "--rounds", "1", "--warmup", "0",
                           "--quiet-wait", "0", "--json", str(tmp_path / "out.json")], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 3, proc.stderr
    assert "refused:" in proc.stderr and ("busy" in proc.stderr or "not quiet" in proc.stderr)
    assert not (tmp_path / "out.json").exists()


def test_the_accounts_floor_is_below_the_run_and_counts_every_build():
    """bench_account's floor (every counted step at the machine's limit) of each stored account:
    above the uncounted steps, below the measured wall, its counted part below those steps' own
    seconds (each build as often as it ran); dropping the builds' counts lowers it."""
    import json

    import bench_account

    results = os.path.join(ROOT, "benchmarks", "results")
    names = [n for n in os.listdir(results) if n.startswith("account_")]
    assert names
    for name in names:
        result = json.load(open(os.path.join(results, name)))
        rows, wall = result["account"], result["account"][-1]["seconds"]
        floor = bench_account.floor_seconds(rows, result["limits"])
        measured = sum(r["seconds"] * r.get("count", 1) for r in rows
                       if ("gflop" in r or "gb" in r) and not r["step"].startswith("  of which"))
        assert floor["uncounted"] < floor["seconds"] < wall
        assert floor["counted"] < measured
        once = [{k: v for k, v in r.items() if k != "count"} for r in rows]
        assert bench_account.floor_seconds(once, result["limits"])["seconds"] < floor["seconds"]
