"""The one harness every comparison in benchmarks/ times its contenders with, so that a figure
cannot lie by accident (issue 46):

  - quiet or nothing: around every timed run it reads the machine's busy CPU time (/proc/stat)
    and subtracts the contender's own (its process tree's, from wait4, or what an in-process
    or worker contender reports) and the harness's; if other processes used more than
    BUSY_FRACTION of one core during any timed run (beyond the counters' RESOLUTION),
    `BusyMachine` is raised and no result is written. It also waits, before the first run, for the load average to fall below QUIET_LOAD.
    Each run's record keeps its wall and CPU seconds, the others' CPU seconds and fraction, and
    the 1-minute load average before and after.
  - alternating: every round runs each contender once, the order reversed every other round
    (a contender is never always first after the other's page cache or turbo state); round 0
    is a discarded warm-up.
  - each contender at its best BLAS setting on this machine: `choose_blas` times every setting
    of BLAS_SETTINGS (numpy's OpenBLAS kernels: as detected, forced to Haswell (AVX2), blocked
    for a 2 MB L2; with the BLAS and OpenMP threads' defaults, or with idle threads sleeping at
    once as `import dfmp2` sets for itself), alternating, and keeps the fastest by median; the
    record gives every setting's times and, per contender, what threadpoolctl and torch report
    of its BLAS libraries (library, version, kernel, threads) under the chosen one.
  - bytecode cached for every Python contender alike: PYTHONPYCACHEPREFIX points at one cache
    directory and PYTHONDONTWRITEBYTECODE is removed (a machine that sets it makes every process
    recompile its imports, which users' installs do not do).

    harness = Harness(rounds=3)
    harness.wait_for_quiet()
    best = harness.choose_blas({"pyscf": pyscf_cmd, "dfmp2": dfmp2_cmd})
    runs = harness.alternate({"pyscf": lambda: harness.process(pyscf_cmd, best["pyscf"]), ...})
    harness.write(path, record)      # refuses (BusyMachine) if any timed run was not quiet

A result file carries harness.record() ("harness": settings, machine, BLAS probes, every run).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

BUSY_FRACTION = 0.05  # of one core: more CPU than this used by other processes during a timed run refuses it
QUIET_LOAD = 0.3  # the 1-minute load average the machine must fall below before the first run
QUIET_WAIT_S = 300  # how long wait_for_quiet waits for it
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# /proc/stat counts each core's time in ticks: two readings can be a tick off per core, so other
# processes' CPU time is known to this many seconds (what a run of a few milliseconds must allow)
RESOLUTION = 2 * (os.cpu_count() or 1) / TICK
# numpy's OpenBLAS kernels (PySCF's GEMMs): {name: environment changes}; None removes a variable
_IDLE = {"OPENBLAS_THREAD_TIMEOUT": "4", "OMP_WAIT_POLICY": "PASSIVE"}  # idle BLAS/OpenMP threads sleep at once
_BUSY = {"OPENBLAS_THREAD_TIMEOUT": None, "OMP_WAIT_POLICY": None}  # their defaults: they spin a while
BLAS_SETTINGS = {
    "detected": {"OPENBLAS_CORETYPE": None, "OPENBLAS_L2_SIZE": None, **_BUSY},  # OpenBLAS picks its kernels
    "Haswell": {"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": None, **_BUSY},  # AVX2 (some machines set it)
    "detected-L2": {"OPENBLAS_CORETYPE": None, "OPENBLAS_L2_SIZE": str(2 << 20), **_BUSY},  # blocking for 2 MB L2
    # the thread settings `import dfmp2` makes for itself (its own default), offered to every contender
    "detected-idle": {"OPENBLAS_CORETYPE": None, "OPENBLAS_L2_SIZE": None, **_IDLE},
    "Haswell-idle": {"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": None, **_IDLE},
}
PYCACHE = os.path.join(tempfile.gettempdir(), "dfmp2-bench-pycache")


class BusyMachine(RuntimeError):
    """Another process used the machine during a timed run: the figures are not written."""


@dataclass
class Run:
    """One timed run: contender, round, wall seconds, the contender's CPU seconds, what other
    processes used (CPU seconds and the fraction of one core over the run), the load average
    before and after, and the contender's own payload (its JSON record, its energy, ...)."""

    contender: str
    round: int
    seconds: float
    cpu_seconds: float
    other_cpu_seconds: float
    other_fraction: float
    load_before: float
    load_after: float
    payload: object = field(default=None, repr=False)

    def as_dict(self) -> dict:
        record = asdict(self)
        record.pop("payload")
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in record.items()}


def busy_seconds() -> float:
    """CPU seconds the whole machine has been busy since boot (/proc/stat: user, nice, system,
    irq, softirq, steal; idle and iowait excluded)."""
    with open("/proc/stat", encoding="ascii") as handle:
        fields = handle.readline().split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    return (user + nice + system + irq + softirq + steal) / TICK


def own_seconds() -> float:
    """This process's CPU seconds (all its threads)."""
    times = os.times()
    return times.user + times.system


def load_average() -> float:
    return os.getloadavg()[0]


def bench_environment(changes=None, base=None) -> dict:
    """The environment a contender runs in: `base` (default this process's) with `changes` (None
    values remove a variable), bytecode cached in PYCACHE for everyone alike."""
    env = dict(os.environ if base is None else base)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = PYCACHE
    for key, value in (changes or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = str(value)
    return env


def machine() -> dict:
    """The machine the figures were taken on: the CPU's model name, and its family, model number and
    stepping and the flags that decide GEMM kernels (Zen 4 and Zen 5 both say "AMD EPYC")."""
    first = {}
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if not line.strip() and first:
                    break  # the first processor's block
                key, _, value = line.partition(":")
                first.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    flags = set(first.get("flags", "").split())

    def number(key):
        return int(first[key]) if first.get(key, "").isdigit() else None

    return {"cpu": first.get("model name", ""), "family": number("cpu family"), "model_number": number("model"),
            "stepping": number("stepping"),
            "kernel_flags": [f for f in ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")
                             if f in flags],
            "cores": os.cpu_count(), "avx2": "avx2" in flags, "avx512f": "avx512f" in flags,
            "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9, 1),
            "platform": platform.platform(), "python": platform.python_version()}


PROBE = """
import json, sys
info = {}
try:
    import numpy
    info["numpy"] = numpy.__version__
except ImportError:
    pass
if "torch" in sys.argv[1:]:
    import torch
    info["torch"] = torch.__version__
    info["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    info["torch_mkl"] = torch.backends.mkl.is_available()
    info["torch_threads"] = torch.get_num_threads()
    info["torch_blas"] = [line.strip() for line in torch.__config__.parallel_info().splitlines()
                          if "Math Kernel" in line or "OpenBLAS" in line]
try:
    import threadpoolctl
    info["threadpools"] = [{k: p.get(k) for k in ("internal_api", "version", "architecture", "num_threads",
                                                   "threading_layer", "prefix")}
                           for p in threadpoolctl.threadpool_info()]
except ImportError:
    info["threadpools"] = None
print(json.dumps(info))
"""


def blas_probe(env, torch=False, python=sys.executable) -> dict:
    """What a Python process started with `env` finds of its BLAS: numpy's OpenBLAS (version,
    kernel, threads) through threadpoolctl, and with torch its CPU capability and MKL."""
    proc = subprocess.run([python, "-c", PROBE] + (["torch"] if torch else []), env=env, capture_output=True,
                          text=True, timeout=120)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1:] or ["probe failed"]}
    return json.loads(proc.stdout)


class Harness:
    """Times contenders on a quiet machine, alternating, each at its best BLAS setting (module
    docstring). rounds: timed rounds; warmup: discarded rounds first (0 or 1)."""

    def __init__(self, rounds=3, warmup=1, busy_fraction=BUSY_FRACTION, blas_settings=None, quiet_load=QUIET_LOAD,
                 settle=0.0):
        self.rounds, self.warmup, self.busy_fraction = rounds, warmup, busy_fraction
        self.settle = settle  # seconds before each run, untimed (another worker's idle BLAS threads stop spinning)
        self.blas_settings = dict(BLAS_SETTINGS if blas_settings is None else blas_settings)
        self.quiet_load = quiet_load
        self.runs = []  # every timed Run, in order
        self.blas = {}  # contender -> {"setting", "trials": {setting: [seconds]}, "probe"}
        self.quiet_at_start = None
        self.refused = None  # why the machine was found busy (then nothing is written)

    # ---- measuring

    def measure(self, contender, round_, call) -> Run:
        """Time call() -> (CPU seconds of the contender outside this process, or None when it ran
        in this process; payload), with the CPU time other processes used meanwhile. A timed
        run (round > 0) that was not quiet raises BusyMachine."""
        if self.settle:
            time.sleep(self.settle)
        load_before, busy0, own0, start = load_average(), busy_seconds(), own_seconds(), time.perf_counter()
        outside, payload = call()
        wall = time.perf_counter() - start
        busy, own = busy_seconds() - busy0, own_seconds() - own0
        cpu = own if outside is None else outside
        other = max(0.0, busy - own - (outside or 0.0))
        run = Run(contender, round_, wall, cpu, other, other / wall if wall > 0 else 0.0, load_before, load_average(),
                  payload)
        if round_ > 0:
            self.runs.append(run)
            if other > self.busy_fraction * wall + RESOLUTION:
                self.refused = (f"the machine was busy: other processes used {100 * run.other_fraction:.0f}% of a "
                                f"core ({run.other_cpu_seconds:.2f} CPU s in {wall:.2f} s) during {contender}'s run "
                                f"in round {round_} (at most {100 * self.busy_fraction:.0f}% allowed); no result "
                                "written: stop the other work and run again")
                raise BusyMachine(self.refused)
        return run

    def process(self, command, env=None, cwd=None, payload=None):
        """A call for `measure`: run `command` (which must succeed) in `env` (`bench_environment`
        if None) -> (its process tree's CPU seconds, payload() or None)."""
        env = bench_environment() if env is None else env
        child = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 stdin=subprocess.DEVNULL)
        _, status, usage = os.wait4(child.pid, 0)
        stderr = child.stderr.read().decode(errors="replace")
        child.stderr.close()
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError(f"{' '.join(map(str, command[:4]))} ... failed: {stderr.strip()[-500:]}")
        return usage.ru_utime + usage.ru_stime, payload() if payload else None

    def wait_for_quiet(self, timeout=QUIET_WAIT_S) -> float:
        """Wait until the 1-minute load average is below quiet_load (BusyMachine after `timeout`
        seconds); returns it."""
        deadline = time.monotonic() + timeout
        while load_average() >= self.quiet_load:
            if time.monotonic() > deadline:
                self.refused = (f"the machine is not quiet: load average {load_average():.2f} after {timeout} s "
                                f"(at most {self.quiet_load} to start); no result written")
                raise BusyMachine(self.refused)
            time.sleep(5)
        self.quiet_at_start = load_average()
        return self.quiet_at_start

    # ---- the comparisons

    def alternate(self, calls: dict) -> dict:
        """Run every contender's call (name -> () -> (outside CPU, payload)) once per round,
        warm-up first, the order reversed every other round; -> {name: [Run] of the timed rounds}."""
        names = list(calls)
        timed = {name: [] for name in names}
        for round_ in range(1 - self.warmup, self.rounds + 1):
            for name in (names if round_ % 2 else names[::-1]):
                run = self.measure(name, round_, calls[name])
                if round_ > 0:
                    timed[name].append(run)
            if round_ > 0:
                print(f"round {round_}: " + ", ".join(f"{n} {timed[n][-1].seconds:.2f} s" for n in names), flush=True)
        return timed

    def choose(self, candidates: dict, rounds=1) -> dict:
        """The fastest setting of each contender: candidates {name: {setting: call}} (calls as
        for `measure`), each (name, setting) timed `rounds` times, alternating, every run judged
        quiet (none for a contender with one setting); -> {name: (fastest setting by median,
        {setting: [seconds]})}."""
        # a contender with one setting has nothing to choose: no trial runs
        trials = {(name, setting): [] for name, calls in candidates.items() if len(calls) > 1 for setting in calls}
        for round_ in range(rounds):
            for name, setting in (list(trials) if round_ % 2 == 0 else list(trials)[::-1]):
                trials[(name, setting)].append(self.measure(f"{name} [{setting}]", round_ + 1,
                                                            candidates[name][setting]).seconds)
        chosen = {}
        for name, calls in candidates.items():
            times = {setting: trials.get((name, setting), []) for setting in calls}
            if len(calls) == 1:
                chosen[name] = (next(iter(calls)), times)
                continue
            chosen[name] = (min(times, key=lambda s: statistics.median(times[s])), times)
        return chosen

    def choose_blas(self, commands: dict, rounds=1, torch=None) -> dict:
        """Each contender's fastest BLAS setting: every (contender, setting) run `rounds` times,
        alternating, after one warm-up of each contender (none with warmup 0); commands: name ->
        (command, base env or None, working directory or None). torch: names whose probe also
        loads torch (default: those whose command names dfmp2). Returns {name: the environment to
        time it in}; the trials and probes go into the record."""
        for name, (command, base, cwd) in commands.items() if self.warmup else ():  # warm-up (caches)
            self.measure(name, 0, lambda: self.process(command, bench_environment(base=base), cwd))
        envs = {name: {setting: bench_environment(changes, base) for setting, changes in self.blas_settings.items()}
                for name, (command, base, _) in commands.items()}
        best = self.choose({name: {setting: (lambda c=command, e=env, d=cwd: self.process(c, e, d))
                                   for setting, env in envs[name].items()}
                            for name, (command, base, cwd) in commands.items()}, rounds)
        chosen = {}
        for name, (command, base, _) in commands.items():
            setting, times = best[name]
            uses_torch = any("dfmp2" in str(part) for part in command) if torch is None else name in torch
            self.note_blas(name, setting, envs[name][setting], uses_torch, times)
            chosen[name] = envs[name][setting]
        return chosen

    def note_blas(self, name, setting, env, torch=False, trials=None):
        """Record the BLAS setting a contender runs with (its trials: {setting: [seconds]}) and
        what a process started in `env` finds of its BLAS libraries (`blas_probe`)."""
        self.blas[name] = {"setting": setting, "environment": dict(self.blas_settings.get(setting, {})),
                           "trials": {k: [round(t, 3) for t in v] for k, v in (trials or {}).items()},
                           "probe": blas_probe(env, torch)}

    # ---- the record

    def record(self) -> dict:
        """What a result file holds of the harness: its rules, the machine, each contender's BLAS
        and every timed run."""
        if self.refused:
            raise BusyMachine(self.refused)
        return {"harness": {"busy_fraction": self.busy_fraction, "quiet_load": self.quiet_load,
                            "load_at_start": self.quiet_at_start, "rounds": self.rounds, "warmup": self.warmup,
                            "alternating": "order reversed every other round", "bytecode_cache": PYCACHE,
                            "largest_other_fraction": max((r.other_fraction for r in self.runs), default=0.0)},
                "machine": machine(), "blas": self.blas, "runs": [r.as_dict() for r in self.runs],
                "date": time.strftime("%Y-%m-%d %H:%M"), "commit": _commit()}

    def write(self, path, record: dict):
        """Write `record` with the harness's own (record()) to `path`; BusyMachine (nothing
        written) if any timed run was not quiet."""
        full = {**record, **self.record()}
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(full, handle, indent=1)
            handle.write("\n")
        return full


def add_arguments(parser, rounds=3):
    """The harness's options every benchmark script takes."""
    parser.add_argument("--rounds", type=int, default=rounds, help="timed rounds after the warm-up")
    parser.add_argument("--warmup", type=int, default=1, choices=(0, 1), help="run a discarded warm-up round")
    parser.add_argument("--blas-rounds", type=int, default=1, help="runs of each contender per BLAS setting")
    parser.add_argument("--blas-settings", default=",".join(BLAS_SETTINGS),
                        help=f"the BLAS settings to try, of: {', '.join(BLAS_SETTINGS)}")
    parser.add_argument("--quiet-wait", type=float, default=QUIET_WAIT_S,
                        help="seconds to wait for the load average to fall below QUIET_LOAD before the first run")


def from_arguments(args) -> Harness:
    """The Harness the options of `add_arguments` ask for, the machine waited for until quiet."""
    names = [n for n in args.blas_settings.split(",") if n]
    unknown = [n for n in names if n not in BLAS_SETTINGS]
    if unknown or not names:
        raise SystemExit(f"unknown BLAS setting(s) {unknown} (use: {', '.join(BLAS_SETTINGS)})")
    bench = Harness(rounds=args.rounds, warmup=args.warmup, blas_settings={n: BLAS_SETTINGS[n] for n in names})
    bench.blas_rounds = args.blas_rounds
    bench.wait_for_quiet(args.quiet_wait)
    return bench


def median(runs) -> float:
    return statistics.median(r.seconds for r in runs)


def median_ratio(numerators, denominators) -> float:
    """The median over rounds of numerator / denominator seconds (> 1: the denominator is faster)."""
    return statistics.median(a.seconds / b.seconds for a, b in zip(numerators, denominators))


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=os.path.dirname(os.path.abspath(__file__)), timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def main_guard(run):
    """Run a benchmark's main; a busy machine ends it with the harness's message, exit status 3."""
    try:
        return run()
    except BusyMachine as busy:
        print(f"refused: {busy}", file=sys.stderr)
        sys.exit(3)

