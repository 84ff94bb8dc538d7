"""Run PySCF's own DF-MP2 test files with PySCF's DF-MP2 classes swapped for dfmp2's.

    python tools/pyscf_dropin_tests.py --tests DIR [--original] [--json OUT] [-k EXPR]

DIR holds PySCF test files, any of: test_dfmp2.py, test_dfump2.py, test_dfmp2_native.py,
test_dfump2_native.py, test_dfromp2.py. They are not part of this project (PySCF's licence;
we do not copy their code): take them from a PySCF checkout, e.g.

    mkdir -p /tmp/pyscf_tests && cd pyscf && for t in dfmp2 dfump2 dfmp2_native dfump2_native; do
        git show v2.14.0:pyscf/mp/test/test_$t.py > /tmp/pyscf_tests/test_$t.py; done

(test_dfromp2.py is newer than PySCF 2.14: take it from PySCF's master, pyscf/mp/test/; it
fails with --original on PySCF 2.14, which has no DF-ROMP2.)

Each file runs in its own `python -m pytest -q -p no:cacheprovider -rA` subprocess, from a
temporary directory holding a copy of it and an empty pytest.ini (so this project's
tests/conftest.py and settings are not used), with the plugin tools/pyscf_dropin_swap.py
loaded (`-p pyscf_dropin_swap`): it replaces PySCF's classes by dfmp2's before the test
modules are imported (the table SWAPS there lists every name). --original loads no plugin, to
show the files pass on the installed PySCF. This checkout's dfmp2 is put first on PYTHONPATH.

Prints one row per test (file, test, outcome, for failures the last line of the exception)
and totals; --json OUT writes the rows as JSON. Outcome "error" means pytest could not run the
test (collection or set-up failed, or the swap refused: then one "(pytest)" row per file).
Exit status 0 once the files ran, whatever their outcomes; 2 on bad arguments.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

TEST_FILES = ["test_dfmp2.py", "test_dfump2.py", "test_dfmp2_native.py",
              "test_dfump2_native.py", "test_dfromp2.py"]
TOOLS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TOOLS)


def _last_line(text):
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def run_file(path, original, keyword):
    """Run one test file under pytest -> (rows, pytest's stderr)."""
    name = os.path.basename(path)
    with tempfile.TemporaryDirectory(prefix="pyscf_dropin_") as tmp:
        shutil.copy(path, tmp)
        ini = os.path.join(tmp, "pytest.ini")
        with open(ini, "w") as f:
            f.write("[pytest]\n")
        report = os.path.join(tmp, "junit.xml")
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA",
               "-c", ini, "--rootdir", tmp, "--junitxml", report]
        if not original:
            cmd += ["-p", "pyscf_dropin_swap"]
        if keyword:
            cmd += ["-k", keyword]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [ROOT, TOOLS] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
        proc = subprocess.run(cmd + [name], cwd=tmp, env=env, capture_output=True, text=True)
        if not os.path.exists(report):  # pytest stopped before running anything
            err = proc.stderr
            message = (err[err.index("ERROR:"):].splitlines()[0] if "ERROR:" in err
                       else _last_line(err) or _last_line(proc.stdout))
            return [dict(file=name, test="(pytest)", outcome="error",
                         message=f"pytest exit {proc.returncode}: {message}")], proc.stderr
        rows = []
        for case in ET.parse(report).getroot().iter("testcase"):
            test = case.get("name")
            cls = case.get("classname", "").split(".", 1)[1:]  # "test_x.KnownValues" -> class
            outcome, message = "passed", ""
            for child in case:
                if child.tag in ("failure", "error", "skipped"):
                    outcome = {"failure": "failed"}.get(child.tag, child.tag)
                    message = _last_line(child.get("message")) or _last_line(child.text)
                    if child.tag == "error":  # message is "collection failure" or the like
                        e_lines = [x[1:] for x in (child.text or "").splitlines() if x[:2] == "E "]
                        message = _last_line("\n".join(e_lines)) or message
                    break
            rows.append(dict(file=name, test="::".join(cls + [test]), outcome=outcome,
                             message=message))
        return rows, proc.stderr


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", required=True, metavar="DIR", help="folder of PySCF test files")
    parser.add_argument("--original", action="store_true", help="no swap: PySCF's own classes")
    parser.add_argument("--json", metavar="OUT", help="also write the results as JSON")
    parser.add_argument("-k", metavar="EXPR", dest="keyword", help="pytest -k expression")
    parser.error = lambda message: parser.exit(2, f"error: {message}\n")  # one line, no usage
    args = parser.parse_args(argv)
    if not os.path.isdir(args.tests):
        parser.exit(2, f"error: --tests {args.tests}: not a directory\n")
    files = [os.path.join(args.tests, f) for f in TEST_FILES
             if os.path.isfile(os.path.join(args.tests, f))]
    if not files:
        parser.exit(2, f"error: --tests {args.tests} holds none of {', '.join(TEST_FILES)}\n")

    print(f"Mode: {'original PySCF classes' if args.original else 'swapped for dfmp2'} "
          f"(PySCF from {_pyscf_location()})", flush=True)
    rows, swap_shown, errors_shown = [], False, set()
    for path in files:
        start = time.time()
        file_rows, stderr = run_file(path, args.original, args.keyword)
        rows += file_rows
        if not swap_shown and "pyscf_dropin_swap: swapped" in stderr:  # the plugin's list, once
            lines = stderr[stderr.index("pyscf_dropin_swap: swapped"):].splitlines()
            n = next((i for i, ln in enumerate(lines[1:], 1) if ln[:2] != "  "), len(lines))
            print("\n".join(lines[:n]), flush=True)
            swap_shown = True
        if file_rows[:1] and file_rows[0]["test"] == "(pytest)" and stderr not in errors_shown:
            print(stderr.rstrip(), file=sys.stderr, flush=True)  # e.g. the swap's error, in full
            errors_shown.add(stderr)
        print(f"ran {os.path.basename(path)} in {time.time() - start:.0f} s", flush=True)

    width = (max(len(os.path.basename(p)) for p in files),
             max([len(r["test"]) for r in rows] + [4]))
    print()
    print(f"{'file':<{width[0]}}  {'test':<{width[1]}}  outcome  message")
    for r in rows:
        print(f"{r['file']:<{width[0]}}  {r['test']:<{width[1]}}  {r['outcome']:<7}  "
              f"{r['message']}")
    print("\nTotals:")
    outcomes = ["passed", "failed", "skipped", "error"]
    for name in [os.path.basename(p) for p in files] + ["all"]:
        mine = [r for r in rows if name in ("all", r["file"])]
        counts = ", ".join(f"{sum(r['outcome'] == o for r in mine)} {o}" for o in outcomes)
        print(f"  {name:<{width[0]}}  {counts}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


def _pyscf_location():
    code = "import pyscf; print(pyscf.__version__, pyscf.__file__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return out.stdout.strip() or "?"


if __name__ == "__main__":
    sys.exit(main())
