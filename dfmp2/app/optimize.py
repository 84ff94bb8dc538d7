"""Geometry optimisation: geomeTRIC (the optional extra `optimize`) drives dfmp2's analytic
DF-MP2 gradient, one whole run (`driver.run_atoms` with settings.gradient) per geometry it asks for.

    result = optimize_atoms(chem.read_xyz("water.xyz"), settings, max_steps=100, on_step=show)
    result.atoms, result.energies, result.converged

A single atom has nothing to optimise: it is evaluated once (energy and gradient, zero by
translational invariance) and reported converged at its start, in 0 steps.

Convergence: geomeTRIC's default criteria, which are PySCF's geomopt defaults (energy change
1e-6 Eh, RMS / largest gradient 3e-4 / 4.5e-4 Eh/bohr, RMS / largest displacement 1.2e-3 /
1.8e-3 Angstrom), in its TRIC internal coordinates. Coordinates stay in the input's frame and
atom order (geomeTRIC moves the Cartesians it is given; nothing is reoriented).

Checkpoint (`checkpoint.Checkpoint`, section "optimize", file DIR/optimize.npz): the geometry,
energy and gradient of every finished step, rewritten atomically after each step. The same
command with the same DIR replays them to geomeTRIC, which is deterministic: it asks for the
same geometries again and gets the stored answers without a calculation, then goes on from the
first step not stored (a step stopped part-way is run again). A stored step that geomeTRIC does
not ask for again (another machine's arithmetic) ends the replay: it and the later ones are
dropped and recomputed, and the result's notes say so.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import numpy as np

from .. import chem
from ..run.checkpoint import open_checkpoint
from ..run.context import RunContext, Timer
from ..run.settings import Settings
from ..util.errors import InputError, option
from ..util.scratch import named_by, scratch_directory

NAME = "optimize"  # the checkpoint section and file (DIR/optimize.npz)
REPLAY_TOLERANCE = 1e-9  # Angstrom: a stored step is replayed when geomeTRIC asks for its geometry to this
# (the same arithmetic gives the same geometry to the last bit; the stored coordinates are the ones computed)
_QUIET_LOG = """[loggers]
keys=root
[handlers]
keys=null
[formatters]
keys=
[logger_root]
level=CRITICAL
handlers=null
[handler_null]
class=NullHandler
args=()
"""


@dataclass
class Step:
    """One geometry geomeTRIC asked for: coordinates [natm, 3] (Angstrom), E_total (Eh), the
    gradient [natm, 3] (Eh/bohr), wall seconds, and whether it came from the checkpoint."""

    coords: np.ndarray
    energy: float
    gradient: np.ndarray
    seconds: float = 0.0
    replayed: bool = False


@dataclass
class OptimizationResult:
    """start: the atoms optimised ([chem.Atom]: their elements and which are ghosts); steps:
    every geometry evaluated, in order (steps[0]: the start); atoms: the final geometry
    ([chem.Atom], Angstrom); final: the DFMP2Result at it (settings.gradient on); converged:
    geomeTRIC's criteria met within max_steps; notes: what the checkpoint replay found;
    fragments: the input's (chem.Fragment), kept in the geometry files written."""

    start: list
    steps: list
    converged: bool
    final_step: int = -1
    final: object = None
    notes: list = field(default_factory=list)
    fragments: tuple = ()

    @property
    def atoms(self) -> list:
        return _atoms(self.start, self.steps[self.final_step].coords)

    @property
    def energies(self) -> list:
        return [step.energy for step in self.steps]

    def frames(self) -> list:
        """[(comment, atoms, fragments)] per step, for a trajectory file (chem.format_xyz)."""
        return [(f"step {k}  E = {step.energy:.12f} Eh  max|g| = {np.abs(step.gradient).max():.3e} Eh/bohr",
                 _atoms(self.start, step.coords), self.fragments)
                for k, step in enumerate(self.steps)]

    def as_dict(self) -> dict:
        """The optimisation's JSON fields (the final run's own fields come from final.as_dict())."""
        return {"energies": self.energies, "e_tot": self.steps[self.final_step].energy,
                "gradient": self.steps[self.final_step].gradient.tolist(), "atoms": [a.label for a in self.start],
                "converged": self.converged, "steps": len(self.steps),
                "steps_replayed": sum(step.replayed for step in self.steps),
                "coordinates": self.steps[self.final_step].coords.tolist(), "notes": list(self.notes)}


def _atoms(start, coords) -> list:
    """The atoms `start` ([chem.Atom], ghosts staying ghosts) at coordinates [natm, 3] (Angstrom)."""
    return [chem.Atom(a.symbol, tuple(float(c) for c in x), a.ghost) for a, x in zip(start, coords)]


def optimize_atoms(atoms, settings: Settings, max_steps: int = 100, checkpoint: str | None = None,
                   allow_other_files: bool = False, on_step=None, progress=None, fragments=()) -> OptimizationResult:
    """Minimise E_total of `atoms` ([chem.Atom], Angstrom; ghosts move as atoms do, carrying their
    basis functions) with `settings` (the gradient is
    turned on; settings.checkpoint must be None: `checkpoint` is the optimisation's own, see the
    module docstring); max_steps: geomeTRIC's iterations (PySCF's maxsteps; the start is
    evaluated besides). on_step(k, step): called after each step (k from 0); progress: each
    run's progress callback (RunContext); fragments: the input's, for the result's geometry
    files. Returns the result whether or not it converged."""
    from ..api.driver import run_atoms

    modules = _import_geometric()
    if max_steps < 1:
        raise InputError(f"{option('max_steps')} must be at least 1, got {max_steps}")
    if settings.checkpoint is not None:
        raise InputError("an optimisation keeps its own checkpoint (its finished steps): give it as "
                         "optimize_atoms(checkpoint=DIR), not settings.checkpoint")
    settings = settings.replace(gradient=True)
    atoms = list(atoms)
    symbols = [a.symbol for a in atoms]  # geomeTRIC's elements (a ghost moves as its element's atom would)
    start = np.array([a.xyz for a in atoms], dtype=np.float64)
    store = _StepStore(checkpoint, allow_other_files, [a.label for a in atoms], start, settings)
    steps, notes, runs = [], [], {}
    bohr = chem.angstrom_per_bohr()

    def evaluate(coords_bohr):
        coords = coords_bohr.reshape(-1, 3) * bohr
        if not steps and np.abs(coords - start).max() < REPLAY_TOLERANCE:
            coords = start  # the input itself (geomeTRIC's unit conversion differs from PySCF's by 1e-11)
        stored = store.next_stored(len(steps), coords, notes)
        if stored is not None:
            steps.append(stored)
        else:
            with Timer().lap() as lap:
                result = run_atoms(_atoms(atoms, coords), settings, RunContext(progress=progress))
            steps.append(Step(coords, float(result.e_tot), np.asarray(result.gradient, dtype=np.float64), lap.seconds))
            runs[len(steps) - 1] = result
            store.save(steps)
        if on_step is not None:
            on_step(len(steps) - 1, steps[-1])
        return {"energy": steps[-1].energy, "gradient": steps[-1].gradient.ravel()}

    try:
        if len(atoms) == 1:  # nothing to move (its gradient is zero): converged at its start, one evaluation
            evaluate(start.ravel() / bohr)
            converged, final_coords = True, start
        else:
            converged, final_coords = _run_geometric(modules, symbols, start, evaluate, max_steps, settings.scratch)
        final_step = _final_step(steps, final_coords)
        if final_step not in runs:  # the final geometry came from the checkpoint: its full record is run again
            runs[final_step] = run_atoms(_atoms(atoms, steps[final_step].coords), settings, RunContext(progress=progress))
        return OptimizationResult(atoms, steps, converged, final_step, runs[final_step], notes, tuple(fragments))
    finally:
        store.close()


def _import_geometric():
    try:
        from geometric import engine, errors, molecule
        from geometric import optimize as optimizer
    except ImportError:
        raise InputError("dfmp2 optimize needs geomeTRIC: pip install 'dfmp2[optimize]' (or pip install "
                         "geometric)") from None
    return engine, errors, molecule, optimizer


def _run_geometric(modules, symbols, start, evaluate, max_steps, scratch) -> tuple:
    """geomeTRIC's optimiser on `evaluate` (coords in bohr -> {"energy", "gradient"}), in a
    scratch directory of its own (removed), its log silenced (the caller reports the steps).
    Returns (converged, final coordinates in Angstrom [natm, 3], geomeTRIC's unit)."""
    engine_module, errors, molecule_module, optimizer = modules

    class DFMP2Engine(engine_module.Engine):
        def calc_new(self, coords, dirname):
            return evaluate(np.asarray(coords, dtype=np.float64))

    molecule = molecule_module.Molecule()
    molecule.elem, molecule.xyzs = list(symbols), [start.copy()]
    root, level, handlers = logging.getLogger(), logging.getLogger().level, logging.getLogger().handlers[:]
    with scratch_directory("optimize", scratch) as directory:
        log_ini = os.path.join(directory, "log.ini")
        with open(log_ini, "w", encoding="utf-8") as handle:
            handle.write(_QUIET_LOG)
        try:
            final = optimizer.run_optimizer(customengine=DFMP2Engine(molecule), input=os.path.join(
                directory, "dfmp2"), maxiter=max_steps, logIni=log_ini)
            return True, np.asarray(final.xyzs[-1], dtype=np.float64)
        except errors.GeomOptNotConvergedError:
            return False, None
        finally:  # geomeTRIC configures the root logger: put it back as it was
            root.handlers[:] = handlers
            root.setLevel(level)


def _final_step(steps, final_coords) -> int:
    """The index of the step at geomeTRIC's final geometry (the last step if it did not converge)."""
    if final_coords is None:
        return len(steps) - 1
    distances = [np.abs(step.coords - final_coords).max() for step in steps]
    best = int(np.argmin(distances))
    if distances[best] > 1e-6:
        raise RuntimeError(f"geomeTRIC's final geometry is none of the {len(steps)} it asked for "
                           f"(closest {distances[best]:.2e} Angstrom away)")
    return best


class _StepStore:
    """The finished steps in a checkpoint directory (module docstring), or nowhere (None). While it
    is open, every scratch directory the optimisation makes (geomeTRIC's, each run's) is named by
    the checkpoint (`scratch.named_by`), so that the next run of it removes what a killed one left."""

    def __init__(self, directory, allow_other_files, symbols, start, settings):
        self.checkpoint, self.stored, self._named = None, [], None
        if directory is None:
            return
        identity = {"symbols": symbols, "start": start.tolist(),
                    "settings": {k: v for k, v in vars(settings).items()
                                 if k not in ("max_memory", "scratch", "checkpoint", "checkpoint_allow_other_files")}}
        self.checkpoint = open_checkpoint(directory, allow_other_files)
        try:
            self._named = named_by(self.checkpoint.scratch_prefix, settings.scratch)
            self._named.__enter__()  # (locked first: a dead run's scratch of it removed)
            if self.checkpoint.claim(NAME, identity):
                arrays = self.checkpoint.load_arrays(NAME, "the optimisation steps")
                if arrays is not None:
                    self.stored = [Step(c, float(e), g, replayed=True)
                                   for c, e, g in zip(arrays["coords"], arrays["energies"], arrays["gradients"])]
        except BaseException:
            self.close()
            raise

    def next_stored(self, k, coords, notes):
        """The stored step k if it is at `coords`, else None (and from k on, nothing is replayed)."""
        if k >= len(self.stored):
            return None
        if np.abs(self.stored[k].coords - coords).max() <= REPLAY_TOLERANCE:
            return self.stored[k]
        notes.append(f"checkpoint: geomeTRIC asked for another geometry at step {k} than the one stored; "
                     f"steps {k}-{len(self.stored) - 1} recomputed")
        self.stored = self.stored[:k]
        return None

    def save(self, steps):
        if self.checkpoint is not None:
            self.checkpoint.save_arrays(NAME, NAME, coords=np.array([s.coords for s in steps]),
                                        energies=np.array([s.energy for s in steps]),
                                        gradients=np.array([s.gradient for s in steps]))

    def close(self):
        if self._named is not None:
            self._named.__exit__(None, None, None)
            self._named = None
        if self.checkpoint is not None:
            self.checkpoint.close()
            self.checkpoint = None
