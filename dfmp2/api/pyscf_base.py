"""What every dfmp2 class for PySCF shares (`PySCFMP2Base`): the mean field taken as PySCF
holds it, the run through `dfmp2.api.driver`, its energies, densities and gradients read from the
one result object, and PySCF's `Gradients` and scanner."""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
from pyscf import lib
from pyscf.lib import logger

from .. import chem
from ..kernels import device_name
from ..mp2.orbitals import active_orbitals, natural_orbitals
from ..mp2.pipeline import scs_correlation
from ..run.budget import caller_limit
from ..run.context import RunContext
from ..run.ranks import join_launched_team
from ..run.settings import Settings, frozen_per_spin
from ..util.clock import clock, cpu_seconds
from ..util.errors import InputError
from ..util.system_memory import MB
from .driver import run_mean_field

GRADIENTS_PENDING = ("analytic DF-MP2 gradients of ROHF and Kohn-Sham references are not implemented in dfmp2 "
                     "(RHF and UHF are)")
ROHF_DENSITIES_PENDING = "MP2 densities of ROHF references are not implemented in dfmp2 (RHF and UHF are)"

# drop-in attribute -> the Settings field it sets (`PySCFMP2Base.settings`); NOT_FOR_THE_DROP_IN: the mean field's, or a method's
SETTINGS_OF_ATTRIBUTES = {name: name for name in ("frozen device precision simulate nki_api transform allow_non_aufbau max_memory "
                                                  "checkpoint force_outcore include_singles checkpoint_allow_other_files "
                                                  "method laplace").split()}
NOT_FOR_THE_DROP_IN = frozenset(("basis ecp auxbasis jk_auxbasis cartesian charge spin reference scf scf_max_cycle "
                                 "scf_backend scf_precision screening frozen_core xc c_os c_ss with_rdm1 gradient properties "
                                 "with_gamma rdm1_scaling with_t2 model_only warm_kernels scratch").split())


class PySCFMP2Base(lib.StreamObject):
    """What both conventions share: options, the run, the results and PySCF's attributes."""

    _keys = {"frozen", "auxbasis", "device", "precision", "simulate", "nki_api", "transform",
             "allow_non_aufbau", "with_df", "mo_coeff", "mo_occ", "mo_energy", "result", "e_hf",
             "e_ref", "e_corr", "e_corr_os", "e_corr_ss", "e_corr_singles", "reference",
             "spin_square", "t2", "max_memory", "mol", "stdout", "verbose", "checkpoint",
             "checkpoint_allow_other_files", "force_outcore", "include_singles", "converged", "method", "laplace"}

    def __init__(self, mf, frozen=None, mo_coeff=None, mo_occ=None, mo_energy=None, *, auxbasis=None,
                 device="cpu", precision=None, simulate=False, nki_api=None, transform=None,
                 allow_non_aufbau=False):
        mf, self._moved = host_mean_field(mf)
        self._scf = mf
        self.mol = mf.mol
        self.stdout = mf.stdout
        self.verbose = mf.verbose
        self.max_memory = getattr(mf, "max_memory", None)
        self.frozen = frozen
        self.mo_coeff = mf.mo_coeff if mo_coeff is None else mo_coeff
        self.mo_occ = mf.mo_occ if mo_occ is None else mo_occ
        if mo_energy is None and self.mo_coeff is not mf.mo_coeff:  # as PySCF: from their Fock matrix
            mo_energy = chem.with_orbitals(mf, self.mo_coeff, self.mo_occ).mo_energy
        self.mo_energy = mf.mo_energy if mo_energy is None else mo_energy
        self.auxbasis = auxbasis  # kept for dump_flags; with_df carries the choice
        self.with_df = None
        self.device = device
        self.precision = precision  # None: fp64, or fp32 on trn1/trn2/trn3
        self.simulate = simulate  # trn1/trn2/trn3 only: run the NKI kernels on dfmp2's emulator
        self.nki_api = nki_api  # with simulate: the NKI release the emulator follows (None: newest)
        self.transform = transform  # trn1/trn2/trn3: AO->MO transform "exact" (None: default) or "fp32"
        self.allow_non_aufbau = allow_non_aufbau  # accept a deliberately non-aufbau reference
        self.checkpoint = None  # a directory: keep B and finished pair tasks, resume from them
        self.checkpoint_allow_other_files = False  # use a checkpoint directory holding other files
        self.force_outcore = False  # keep (ia|P) on disk whatever the budget (as PySCF's)
        self.include_singles = True  # ROHF: add the singles to e_corr
        self.method, self.laplace = "mp2", None  # "sos-mp2": e_corr = 1.3 E_os; laplace: "off", "auto" or N (Settings)
        self.converged = False
        self.result = None
        self.e_hf = None if chem.is_kohn_sham(mf) else mf.e_tot  # None for a Kohn-Sham reference
        self.e_ref = mf.e_tot
        self.e_corr = None
        self.e_corr_os = None
        self.e_corr_ss = None
        self.e_corr_singles = None
        self.reference = None
        self.spin_square = None
        self.t2 = None
        self._noted_jk_fit = False
        self._nocc = self._nmo = None  # PySCF's overrides of nocc and nmo (its helpers read them)

    # ------------------------------------------------------------------ PySCF's attributes
    @property
    def e_tot(self):
        return None if self.e_corr is None else self.e_ref + self.e_corr

    emp2 = property(lambda self: self.e_corr)

    @property
    def emp2_scs(self):
        """PySCF's SCS-MP2 correlation energy, 6/5 E_os + 1/3 E_ss, plus the ROHF singles unscaled
        (as PySCF's DFROMP2: 0 for RHF/UHF and with include_singles=False)."""
        if self.e_corr is None or self.e_corr_ss is None:  # (SOS-MP2 through the Laplace path: no E_ss)
            return None
        return scs_correlation(self.e_corr_os, self.e_corr_ss, self.e_corr_singles or 0.0)

    e_tot_scs = property(lambda self: None if self.emp2_scs is None else self.e_ref + self.emp2_scs)

    @property
    def e_scs(self):
        """Grimme's SCS-MP2 correlation energy with the ROHF singles (Psi4's convention)."""
        return None if self.result is None else self.result.e_scs

    def _active(self):
        """[(occ_index, vir_index, nfrozen)] per spin channel of this object's frozen orbitals."""
        occ = np.asarray(self.mo_occ)
        if occ.ndim == 1 and chem.reference_kind(self._scf) == "rohf":  # alpha and beta occupations
            occ = np.array([occ > 0, occ > 1], dtype=float)
        per_spin = [occ] if occ.ndim == 1 else [occ[0], occ[1]]
        return [active_orbitals(o, f) for o, f in zip(per_spin, frozen_per_spin(self.frozen, len(per_spin)))]

    def _per_spin(self, values):
        return values[0] if len(values) == 1 else tuple(values)

    @property
    def nocc(self):
        """Active occupied orbitals (a pair for UHF/ROHF); set `frozen` to change them."""
        return self._per_spin([o.size for o, _, _ in self._active()])

    @nocc.setter
    def nocc(self, value):
        raise InputError(f"nocc = {value}: dfmp2 takes the active orbitals from frozen= (a count or a list of "
                         "orbital indices), not from nocc/nmo")

    @property
    def nmo(self):
        """Active orbitals (a pair for UHF/ROHF); set `frozen` to change them."""
        return self._per_spin([o.size + v.size for o, v, _ in self._active()])

    @nmo.setter
    def nmo(self, value):
        raise InputError(f"nmo = {value}: dfmp2 takes the active orbitals from frozen= (a count or a list of "
                         "orbital indices), not from nocc/nmo")

    def get_nocc(self):
        return self.nocc

    def get_nmo(self):
        return self.nmo

    def get_frozen_mask(self):
        """True for the active orbitals [nmo] (a pair of masks for UHF/ROHF), as PySCF's."""
        nmo = np.asarray(self.mo_occ).shape[-1]
        masks = []
        for occ_index, vir_index, _ in self._active():
            mask = np.zeros(nmo, dtype=bool)
            mask[occ_index] = mask[vir_index] = True
            masks.append(mask)
        return self._per_spin(masks)

    def nuc_grad_method(self):
        """The analytic DF-MP2 nuclear gradient object (PySCF's convention: .kernel() -> de
        [natm, 3], Eh/bohr). RHF and UHF references (`dfmp2.mp2.gradient`)."""
        if chem.reference_kind(self._scf) == "rohf" or chem.is_kohn_sham(self._scf):
            raise NotImplementedError(GRADIENTS_PENDING)
        return Gradients(self)

    def Gradients(self):  # noqa: N802 (PySCF's name)
        return self.nuc_grad_method()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.delete()

    def delete(self):
        """Let go of what the run holds (t2, the result's arrays); energies stay."""
        self.t2 = None
        if self.result is not None:
            self.result.correlation.t2 = None
            self.result.correlation.rdm1_active = None

    def reset(self, mol=None):
        if mol is not None:
            self.mol = mol
        if self.with_df is not None:
            self.with_df.reset(mol)
        self._scf.reset(mol)
        self.result = None
        return self

    def dump_flags(self, verbose=None, integrals=None):
        """PySCF's options log (integrals: the run's, so that they are not looked up again)."""
        log = logger.new_logger(self, verbose)
        log.info("")
        log.info("******** %s (dfmp2) ********", self.__class__.__name__)
        log.info("nocc = %s, nmo = %s", self.nocc, self.nmo)
        log.info("frozen orbitals = %s", self.frozen)
        log.info("device = %s, precision = %s%s", self.device, self.precision or "default",
                 " (emulated)" if self.simulate else "")
        log.info("auxiliary basis = %s", (integrals or self._integrals()).auxbasis)
        log.info("max_memory %s MB (current use %d MB)", self.max_memory, lib.current_memory()[0])
        return self

    # ------------------------------------------------------------------ the run
    def settings(self, **changes) -> Settings:
        """This object's options as dfmp2 Settings, by name (`SETTINGS_OF_ATTRIBUTES`; keyword `changes` on
        top); max_memory the user's figure, None where it is PySCF's own default (`_budget_rule`)."""
        chosen = {field: getattr(self, attribute) for attribute, field in SETTINGS_OF_ATTRIBUTES.items()}
        return Settings(**{**chosen, "max_memory": None if self._default_max_memory() else self.max_memory}).replace(**changes)

    def _default_max_memory(self) -> bool:
        """Whether max_memory is PySCF's own default (pyscf.lib.param.MAX_MEMORY: 4000 MB unless
        PYSCF_MAX_MEMORY says otherwise), which nobody chose for this run (a figure set to the same
        value is taken as the default too)."""
        return self.max_memory is not None and self.max_memory == lib.param.MAX_MEMORY

    def _budget_rule(self):
        """Within: the memory budget's rule for this object's runs (`budget.memory_budget`): a
        max_memory the user set is the user's figure (above a hard limit it is replaced, with a
        warning); PySCF's own default is one more limit (`budget.caller_limit`): the budget where
        it is the smallest, never above a cgroup's or an rlimit's, and no warning."""
        if not self._default_max_memory():
            return nullcontext()
        return caller_limit(int(self.max_memory * MB), f"PySCF's default max_memory: {self.max_memory:g} MB")

    def _integrals(self):
        """The three-center integrals of this object's auxiliary basis."""
        return chem.MNPIntegrals(self.mol, self.auxbasis)

    def _mean_field(self, mo_coeff=None, mo_energy=None):
        """The mean field with this object's (or the given) orbitals: orbitals given without
        energies get those of their Fock matrix, and e_tot is their energy (`chem.with_orbitals`)."""
        mf = self._scf
        coeff = self.mo_coeff if mo_coeff is None else mo_coeff
        mo_energy = self.mo_energy if mo_energy is None and mo_coeff is None else mo_energy
        same = coeff is mf.mo_coeff and self.mo_occ is mf.mo_occ and mo_energy is mf.mo_energy
        return mf if same else chem.with_orbitals(mf, coeff, self.mo_occ, mo_energy)

    def _run(self, mo_energy=None, mo_coeff=None, **changes):
        """Run DF-MP2 with `changes` to the settings; sets the energies and returns the result
        (changes "integrals", "given": run_mean_field's; "notes": last in the result's, not logged)."""
        log = logger.new_logger(self)
        wall0, cpu0 = clock(), cpu_seconds()  # dfmp2's clock: PySCF's timer line, printed below
        integrals = changes.pop("integrals", None) or self._integrals()
        if self.verbose >= logger.INFO:
            self.dump_flags(integrals=integrals)
        given, later = changes.pop("given", None), changes.pop("notes", [])  # later: the caller logs them
        context = RunContext(team=join_launched_team(device_name(self.device), self.simulate))
        moved = [self._moved] if self._moved else []
        with self._budget_rule():
            self.result = run_mean_field(self._mean_field(mo_coeff, mo_energy), self.settings(**changes),
                                         integrals=integrals, context=context, given=given, notes=moved + list(later))
        for name in ("e_ref", "e_corr_os", "e_corr_ss", "e_corr_singles", "reference", "spin_square"):
            setattr(self, name, getattr(self.result, name))
        self.e_hf = self.result.e_hf
        self.e_corr = self._correlation_energy()
        self.converged = True
        for note in self.result.notes[:len(self.result.notes) - len(later)]:
            log.note("dfmp2: %s", note)
        log.note("E(%s) = %.15g  E_corr = %.15g", self.__class__.__name__, self.e_tot, self.e_corr)
        if self.e_corr_ss is not None:  # (SOS-MP2 through the Laplace path: E_os only)
            log.note("E(SCS-%s) = %.15g  E_corr = %.15g", self.__class__.__name__, self.e_tot_scs, self.emp2_scs)
            log.info("E_corr(same-spin) = %.15g", self.e_corr_ss)
        log.info("E_corr(oppo-spin) = %.15g", self.e_corr_os)
        if self.e_corr_singles:  # ROHF (0 with include_singles=False, as PySCF)
            log.info("E_corr(singles) = %.15g", self.e_corr_singles)
        log.debug("    CPU time for %s %9.2f sec, wall time %9.2f sec", type(self).__name__, cpu_seconds() - cpu0,
                  clock() - wall0)  # PySCF's log.timer line (at its TIMER_LEVEL, DEBUG), on dfmp2's clock
        return self.result

    def _response_inputs(self) -> tuple:
        """(the run's correlation record with its three-index density, the fitting integrals,
        the CPHF's tol and max_cycle) for the orbital response (relaxed densities, gradients):
        runs the energy with those densities first when the last run has none. The run gets its
        own integrals object (a run may set screening on the one it is given)."""
        corr = None if self.result is None else self.result.correlation
        if not self._on_root(lambda: corr is not None and corr.gamma is not None):  # (G: rank 0's, over ranks)
            self._run(with_rdm1=True, with_gamma=True, rdm1_scaling=self._rdm1_scaling(), with_t2=False,
                      integrals=self._raw_integrals())
            corr = self.result.correlation
        cphf = {"tol": getattr(self, "cphf_tol", getattr(self._scf, "conv_tol", 1e-9)),
                "max_cycle": getattr(self, "cphf_max_cycle", 100)}
        return corr, self._raw_integrals(), cphf

    def _on_root(self, work):
        """work() in one process; under torchrun on rank 0 alone, which holds the three-index
        density G (`pipeline.density_stage`), its value on every rank."""
        team = join_launched_team(device_name(self.device), self.simulate)

        def in_scratch():  # PySCF's temporary files (the response's fitting): the run's, removed with it
            with chem.pyscf_scratch():
                return work()
        return in_scratch() if team is None else team.on_root(in_scratch)

    def _raw_integrals(self):
        """(mn|P) in the auxiliary basis of this object's runs, as chem.MNPIntegrals
        (the orbital response and the gradient need the fitting integrals themselves, not
        Cholesky vectors a density-fitted SCF holds)."""
        integrals = self._integrals()
        if isinstance(integrals, chem.MNPIntegrals):
            return integrals
        if chem.is_periodic(self._scf):
            raise NotImplementedError("relaxed densities and gradients of periodic mean fields are not implemented")
        auxmol = getattr(self.with_df, "auxmol", None)
        return chem.MNPIntegrals(self.mol, auxmol.basis if auxmol is not None else self.with_df.auxbasis)

    def _correlation_energy(self):
        """e_corr of the finished run (the SCS classes scale its parts)."""
        return self.result.e_corr

    def make_rdm1(self, relaxed=False, ao_repr=False):
        """The DF-MP2 one-particle density: MO basis (AO with ao_repr), reference occupations plus
        the MP2 correction; RHF [nmo, nmo] (trace = electron count), UHF [2, nmo, nmo] (alpha,
        beta; as PySCF's dfump2_native); built blockwise from the (ia|kb) blocks (no t2 needed).
        relaxed=True: with the orbital response (Z-vector; `dfmp2.mp2.response`), the CPHF solved to
        cphf_tol (default: the SCF's conv_tol) in at most cphf_max_cycle iterations."""
        if chem.reference_kind(self._scf) == "rohf":
            raise NotImplementedError(ROHF_DENSITIES_PENDING)
        if relaxed:
            from ..mp2.response import relaxed_density, response_mean_field

            corr, integrals, cphf = self._response_inputs()

            def relaxed_on_this_process():
                with self._budget_rule(), response_mean_field(self._scf, self.settings()) as response_mf:
                    return relaxed_density(response_mf, corr.rdm1_active, corr.gamma, integrals, **cphf)

            dm = self._on_root(relaxed_on_this_process)
            coeffs = np.asarray(self.mo_coeff)
            if not ao_repr:
                return dm
            return coeffs @ dm @ coeffs.T if dm.ndim == 2 else np.array([c @ d @ c.T for c, d in zip(coeffs, dm)])
        if self.result is None or self.result.correlation.rdm1_active is None:
            self._run(with_rdm1=True, rdm1_scaling=self._rdm1_scaling(), with_t2=False)
        return self.result.make_rdm1(np.asarray(self.mo_coeff), self.mo_occ, ao_repr)

    def _rdm1_scaling(self):
        return (1.0, 1.0)

    def make_natorbs(self, rdm1_mo=None, relaxed=False):
        """(natocc, natorb): natural occupations, descending, and natural orbitals [nao, nmo] (AO
        coefficients) of `rdm1_mo` (default: make_rdm1(relaxed)); UHF: of the spin-summed density
        in the alpha orbitals' basis (as PySCF's dfump2_native)."""
        # (DFMP2's make_rdm1 gives UHF's as a tuple (alpha, beta), PySCF's DFUMP2 convention)
        dm = np.asarray(self.make_rdm1(relaxed=relaxed) if rdm1_mo is None else rdm1_mo)
        return natural_orbitals(dm, np.asarray(self.mo_coeff), chem.overlap_matrix(self.mol) if dm.ndim == 3 else None)

    def double_hybrid_energy(self, xc=None, c_os=None, c_ss=None):
        """E_KS + c_os E_os + c_ss E_ss (Eh) of the Kohn-Sham reference this object ran on: xc
        names a double hybrid (`dfmp2.chem.functionals`; its KS part must be the reference's xc), or
        give c_os and c_ss for a custom one. Runs the energy first if needed."""
        from ..chem.functionals import double_hybrid

        if self.result is None:
            self._run(with_t2=False)
        if not self.result.reference.endswith("ks"):
            raise InputError(f"a double hybrid needs a Kohn-Sham reference, not {self.result.reference.upper()}")
        dh = double_hybrid(xc if xc is not None else self._scf.xc, c_os, c_ss)
        if dh.name != "custom" and xc_key(dh.xc) != xc_key(self._scf.xc):
            raise InputError(f"{dh.name}'s KS part is {dh.xc!r}, but the reference used xc {self._scf.xc!r}")
        return self.e_ref + dh.pt2_energy(self.e_corr_os, self.e_corr_ss)


class Gradients(lib.StreamObject):
    """dE_total/dR of a dfmp2 DF-MP2 object, PySCF's gradient conventions: kernel() -> de
    [natm, 3] (Eh/bohr, atoms in the molecule's order and frame), kept in .de; .base is the
    DF-MP2 object, .mol its molecule. Runs the energy (with the densities it needs) first if
    needed; the CPHF is solved to base.cphf_tol (default: the SCF's conv_tol)."""

    def __init__(self, base):
        self.base, self.mol, self.verbose, self.stdout = base, base.mol, base.verbose, base.stdout
        self.de = None

    def kernel(self, atmlst=None):
        from ..kernels import backend_for
        from ..mp2.gradient import nuclear_gradient
        from ..mp2.response import response_mean_field

        base = self.base
        corr, integrals, cphf = base._response_inputs()

        def gradient_on_this_process():
            with base._budget_rule(), response_mean_field(base._scf, base.settings()) as response_mf:
                return nuclear_gradient(response_mf, corr, integrals, backend=backend_for(base.settings()), **cphf)

        de = base._on_root(gradient_on_this_process)
        self.de = de if atmlst is None else de[list(atmlst)]
        logger.note(self, "dfmp2 DF-MP2 gradient (Eh/bohr):\n%s", self.de)
        return self.de

    grad = kernel

    def as_scanner(self):
        """PySCF's gradient scanner (what pyscf.geomopt drives): scanner(mol or coordinates) ->
        (e_tot, de) at that geometry, the SCF rerun from the previous density (PySCF's SCF
        scanner), then DF-MP2 with this object's options, and its gradient."""
        return GradScanner(self)


class GradScanner(lib.GradScanner):
    """The scanner of a dfmp2 `Gradients` (see Gradients.as_scanner)."""

    def __init__(self, grad):
        self.__dict__.update(grad.__dict__)
        self.template, self.mf_scanner = grad.base, grad.base._scf.as_scanner()
        self.base = grad.base

    def __call__(self, mol_or_geom, **kwargs):
        import copy

        from pyscf import gto

        mol = mol_or_geom if isinstance(mol_or_geom, gto.MoleBase) else self.mol.set_geom_(mol_or_geom, inplace=False)
        mf = self.mf_scanner
        mf(mol)
        base = copy.copy(self.template)  # the same options on the new geometry's reference
        base._scf, base.mol, base.result, base.converged = mf, mol, None, False
        if self.template.with_df is not None and self.template.with_df is getattr(self.template._scf, "with_df", None):
            base.with_df = mf.with_df  # the SCF's own fitting, reset to the new geometry by its scanner
        elif self.template.with_df is not None:
            base.with_df = copy.copy(self.template.with_df)
            base.with_df.reset(mol)
        base.mo_coeff, base.mo_occ, base.mo_energy, base.e_ref = mf.mo_coeff, mf.mo_occ, mf.mo_energy, mf.e_tot
        base.e_hf = None if chem.is_kohn_sham(mf) else mf.e_tot
        self.mol, self.base = mol, base
        de = Gradients(base).kernel(getattr(self, "atmlst", None))
        self.de = de
        return base.e_tot, de

    @property
    def converged(self):
        return bool(self.mf_scanner.converged)


def host_mean_field(mf):
    """A gpu4pyscf mean field (`mf.to_gpu()`) is moved to the CPU with its own `to_cpu()` (the
    integrals and orbitals dfmp2 reads are host arrays); returns (mf, note or None); InputError without a mol."""
    note = None
    if (type(mf).__module__ or "").startswith("gpu4pyscf"):
        if not hasattr(mf, "to_cpu"):
            raise InputError(f"{type(mf).__name__} from gpu4pyscf has no to_cpu(): pass the PySCF (CPU) mean field")
        mf, note = mf.to_cpu(), f"gpu4pyscf mean field {type(mf).__name__} moved to the CPU with to_cpu()"
    if getattr(mf, "mol", None) is None:
        raise InputError(f"the drop-in takes a PySCF mean field (RHF, UHF, ROHF, KS), got {type(mf).__name__} {mf!r:.40}")
    return mf, note


def xc_key(xc: str) -> str:
    return "".join(str(xc).upper().split())
