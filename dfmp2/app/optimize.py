"""Geometry optimisation: geomeTRIC (the optional extra `optimize`) drives dfmp2's analytic
DF-MP2 gradient, one whole run (`driver.run_atoms` with settings.gradient) per geometry it asks for.

    result = optimize_atoms(chem.read_xyz("water.xyz"), settings, max_steps=100, on_step=show)
    result.atoms, result.energies, result.converged

A single atom has nothing to optimise: it is evaluated once (energy and gradient, zero by
translational invariance) and reported converged at its start, in 0 steps.

Ghost atoms (basis functions without a nucleus) are held where the input has them, to the bit:
they are not geomeTRIC's atoms, whose energy they are a fixed part of (`GhostFrame`). Nothing
repels the molecule from a ghost, so a molecule free to move would slide into the ghosts' basis
functions (the basis-set superposition error is all the ghost adds: water beside Gh(O) fell 35 mEh
in 100 steps and never converged); so the real atoms' centre and orientation are frozen too
(geomeTRIC's `$freeze` constraints trans-xyz and rotation; a linear molecule, whose rotation
constraint geomeTRIC cannot form, is held on its line about its centre), and only their internal
coordinates relax in the ghosts' functions. The result's notes say so. One real atom beside
ghosts then has nothing to move: it is evaluated once, as a single atom is.

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


LINEAR_TOLERANCE = 1e-3  # Angstrom: atoms this close to one line are a linear molecule (no orientation about it)


@dataclass(frozen=True)
class GhostFrame:
    """The coordinates geomeTRIC moves of a molecule with ghost atoms (module docstring): moving,
    the indices of its real atoms (every atom where there are no ghosts); axes [3, 3], an
    orthogonal matrix: geomeTRIC's coordinates are the real atoms' @ axes (the identity, or for
    a linear molecule axes whose third is its line, whose atoms are then held on it by x, y
    freezes: geomeTRIC's rotation constraint is undefined for a linear molecule); constraints,
    geomeTRIC's constraints file text (None without ghosts); notes, what the result says of it."""

    moving: tuple
    axes: np.ndarray = field(default_factory=lambda: np.eye(3))
    constraints: str | None = None
    notes: tuple = ()

    @classmethod
    def of(cls, atoms) -> GhostFrame:
        moving = tuple(k for k, a in enumerate(atoms) if not a.ghost)
        if len(moving) == len(atoms):
            return cls(moving)
        ghosts = ", ".join(f"{k + 1} ({atoms[k].symbol})" for k, a in enumerate(atoms) if a.ghost)
        real = np.array([atoms[k].xyz for k in moving], dtype=np.float64)
        _, values, vt = np.linalg.svd(real - real.mean(axis=0))
        linear = len(moving) > 1 and (len(values) < 2 or values[1] < LINEAR_TOLERANCE)
        every = f"1-{len(moving)}"  # (geomeTRIC numbers its own atoms, the real ones, from 1)
        held = ("the one real atom's place: nothing moves (evaluated once)" if len(moving) == 1 else
                "the real atoms on their line, about their centre (geomeTRIC $freeze xy, trans-z along it)" if linear
                else "the real atoms' centre and orientation (geomeTRIC $freeze trans-xyz, rotation)")
        note = (f"ghost atoms {ghosts} held where the input has them, and {held}: only internal coordinates relax in "
                "the ghosts' basis functions (free, the molecule would slide into them)")
        constraints = None if len(moving) < 2 else (f"$freeze\nxy {every}\ntrans-z {every}\n" if linear else
                                                    f"$freeze\ntrans-xyz {every}\nrotation {every}\n")
        axes = np.array([vt[1], vt[2], vt[0]]).T if linear else np.eye(3)  # linear: its line (vt[0]) third
        return cls(moving, axes, constraints, (note,))

    def start(self, coords) -> np.ndarray:
        """geomeTRIC's coordinates [nmoving, 3] of every atom's `coords` [natm, 3]."""
        return np.asarray(coords, dtype=np.float64)[list(self.moving)] @ self.axes

    def whole(self, start, coords) -> np.ndarray:
        """Every atom's coordinates [natm, 3]: the ghosts' from `start`, the moving ones' from
        geomeTRIC's `coords` [nmoving, 3] (or flat)."""
        found = np.array(start, dtype=np.float64, copy=True)
        found[list(self.moving)] = np.asarray(coords, dtype=np.float64).reshape(len(self.moving), 3) @ self.axes.T
        return found

    def gradient(self, gradient) -> np.ndarray:
        """geomeTRIC's gradient (flat) of every atom's `gradient` [natm, 3]."""
        return (np.asarray(gradient)[list(self.moving)] @ self.axes).ravel()


def optimize_atoms(atoms, settings: Settings, max_steps: int = 100, checkpoint: str | None = None,
                   allow_other_files: bool = False, on_step=None, progress=None, fragments=()) -> OptimizationResult:
    """Minimise E_total of `atoms` ([chem.Atom], Angstrom; ghosts held fixed with the real atoms'
    centre and orientation: `GhostFrame`) with `settings` (the gradient is
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
    chem.check_geometry(atoms)  # (atoms, not all ghosts) before geomeTRIC is given any
    frame = GhostFrame.of(atoms)
    symbols = [atoms[k].symbol for k in frame.moving]  # geomeTRIC's elements: the real atoms'
    start = np.array([a.xyz for a in atoms], dtype=np.float64)
    store = _StepStore(checkpoint, allow_other_files, [a.label for a in atoms], start, settings)
    steps, notes, runs = [], list(frame.notes), {}
    bohr = chem.angstrom_per_bohr()

    def evaluate(coords_bohr):  # geomeTRIC's atoms (bohr) -> their energy and gradient
        coords = frame.whole(start, coords_bohr.reshape(-1, 3) * bohr)
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
        return {"energy": steps[-1].energy, "gradient": frame.gradient(steps[-1].gradient)}

    try:
        if len(frame.moving) == 1:  # nothing to move (alone, its gradient is zero): converged at its start
            evaluate(frame.start(start).ravel() / bohr)
            converged, final_coords = True, start
        else:
            converged, final_coords = _run_geometric(modules, symbols, frame.start(start), evaluate, max_steps,
                                                     settings.scratch, frame.constraints)
            final_coords = None if final_coords is None else frame.whole(start, final_coords)
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


def _run_geometric(modules, symbols, start, evaluate, max_steps, scratch, constraints=None) -> tuple:
    """geomeTRIC's optimiser on `evaluate` (coords in bohr -> {"energy", "gradient"}), in a
    scratch directory of its own (removed), its log silenced (the caller reports the steps);
    constraints: a geomeTRIC constraints file's text (None: none). Returns (converged, final
    coordinates in Angstrom [natm, 3], geomeTRIC's unit)."""
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
        options = {}
        if constraints is not None:
            options["constraints"] = os.path.join(directory, "constraints.txt")
            with open(options["constraints"], "w", encoding="utf-8") as handle:
                handle.write(constraints)
        try:
            final = optimizer.run_optimizer(customengine=DFMP2Engine(molecule), input=os.path.join(
                directory, "dfmp2"), maxiter=max_steps, logIni=log_ini, **options)
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
