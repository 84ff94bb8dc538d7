"""PySCF plugin: drop-ins for PySCF's DF-MP2 classes, with PySCF's conventions.

    from dfmp2 import DFMP2            # instead of: from pyscf.mp.dfmp2 import DFMP2 (or dfump2's DFUMP2)
    pt = DFMP2(mf, frozen=1)           # device="cuda" / "trn1" + simulate=True, ...
    e_corr, t2 = pt.kernel()           # t2 kept when the memory budget allows it (PySCF's default)
    pt.e_corr, pt.e_corr_os, pt.e_corr_ss, pt.emp2_scs, pt.e_tot, pt.e_corr_singles (ROHF)
    eris = pt.ao2mo(ovL_to_save="ovL.h5"); pt.kernel(eris=eris)    # keep / reuse (ia|P)
    dm = pt.make_rdm1(); natocc, natorb = pt.make_natorbs()       # RHF and UHF

    from dfmp2.native import DFMP2, SCSMP2   # instead of pyscf.mp.dfmp2_native (kernel() -> e_corr)

One class per convention, whatever the reference: `DFMP2` (= `DFUMP2` = `DFROMP2`) follows the
mean field (RHF, UHF, ROHF or their Kohn-Sham counterparts, molecular or periodic at the gamma
point); ROHF references get ROHF-MBPT(2) (semicanonical orbitals, singles included unless
include_singles=False, as PySCF's DFROMP2 and Psi4).

The auxiliary basis, as PySCF chooses it: `pt.with_df` is the mean field's when it has one (a
density-fitted SCF's JK-fit set: the note in the log says how to ask for the MP2-fit set, the
better choice for MP2), else a `pyscf.df.DF` with the MP2-fit set of the orbital basis;
`auxbasis=` replaces it. `pyscf.mp.dfmp2_native`'s classes always take the MP2-fit set (or
`auxbasis`). Periodic mean fields use their GDF three-center integrals as they are.

Under torchrun the object joins the process group and splits the work over the ranks (every
rank's script makes its own SCF; rank 0's orbitals are used).
"""

from __future__ import annotations

import os

import numpy as np
from pyscf import lib
from pyscf.lib import logger

from .. import chem
from ..run.ranks import join_launched_team
from ..run.context import RunContext
from .driver import run_mean_field, three_center_of_mean_field
from ..util.errors import InputError
from ..util.provenance import mismatch
from ..util.files import display
from ..mp2.orbitals import active_orbitals
from ..run.settings import frozen_per_spin
from ..mp2.steps import natural_orbitals
from ..run.settings import IF_ROOM, Settings
from ..run.storage import open_ovl, write_ovl

GRADIENTS_PENDING = ("analytic DF-MP2 gradients of ROHF and Kohn-Sham references are not implemented in dfmp2 "
                     "(RHF and UHF are)")
ROHF_DENSITIES_PENDING = "MP2 densities of ROHF references are not implemented in dfmp2 (RHF and UHF are)"


class _DFMP2Base(lib.StreamObject):
    """What both conventions share: options, the run, the results and PySCF's attributes."""

    _keys = {"frozen", "auxbasis", "device", "precision", "simulate", "nki_api", "transform",
             "allow_non_aufbau", "with_df", "mo_coeff", "mo_occ", "mo_energy", "result", "e_hf",
             "e_ref", "e_corr", "e_corr_os", "e_corr_ss", "e_corr_singles", "reference",
             "spin_square", "t2", "max_memory", "mol", "stdout", "verbose", "checkpoint",
             "checkpoint_allow_other_files", "force_outcore", "include_singles", "converged"}

    def __init__(self, mf, frozen=None, mo_coeff=None, mo_occ=None, mo_energy=None, *, auxbasis=None,
                 device="cpu", precision=None, simulate=False, nki_api=None, transform=None,
                 allow_non_aufbau=False):
        mf, self._moved = _host_mean_field(mf)
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
        self.precision = precision  # None: fp64, or fp32 on trn1/trn2
        self.simulate = simulate  # trn1/trn2 only: run the NKI kernels on dfmp2's emulator
        self.nki_api = nki_api  # with simulate: the NKI release the emulator follows (None: newest)
        self.transform = transform  # trn1/trn2: AO->MO transform "exact" (None: default) or "fp32"
        self.allow_non_aufbau = allow_non_aufbau  # accept a deliberately non-aufbau reference
        self.checkpoint = None  # a directory: keep B and finished pair tasks, resume from them
        self.checkpoint_allow_other_files = False  # use a checkpoint directory holding other files
        self.force_outcore = False  # keep (ia|P) on disk whatever the budget (as PySCF's)
        self.include_singles = True  # ROHF: add the singles to e_corr
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

    @property
    def emp2(self):
        return self.e_corr

    @property
    def emp2_scs(self):
        """PySCF's SCS-MP2 correlation energy, 6/5 E_os + 1/3 E_ss, plus the ROHF singles unscaled
        (as PySCF's DFROMP2: 0 for RHF/UHF and with include_singles=False)."""
        if self.e_corr is None:
            return None
        return 1.2 * self.e_corr_os + self.e_corr_ss / 3.0 + (self.e_corr_singles or 0.0)

    @property
    def e_tot_scs(self):
        return None if self.e_corr is None else self.e_ref + self.emp2_scs

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
        [natm, 3], Eh/bohr). RHF and UHF references (`dfmp2.gradient`)."""
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
        """This object's options as dfmp2 Settings (keyword `changes` on top)."""
        return Settings(frozen=self.frozen, device=self.device, precision=self.precision,
                        simulate=self.simulate, nki_api=self.nki_api, transform=self.transform,
                        allow_non_aufbau=self.allow_non_aufbau, max_memory=self.max_memory,
                        checkpoint=self.checkpoint, force_outcore=self.force_outcore,
                        include_singles=self.include_singles,
                        checkpoint_allow_other_files=self.checkpoint_allow_other_files).replace(**changes)

    def _integrals(self):
        """The three-center integrals of this object's auxiliary basis."""
        return chem.ThreeCenterIntegrals(self.mol, self.auxbasis)

    def _mean_field(self, mo_coeff=None, mo_energy=None):
        """The mean field with this object's (or the given) orbitals: orbitals given without
        energies get those of their Fock matrix, and e_tot is their energy (`chem.with_orbitals`)."""
        mf = self._scf
        coeff = self.mo_coeff if mo_coeff is None else mo_coeff
        if mo_energy is None and mo_coeff is None:
            mo_energy = self.mo_energy
        if coeff is mf.mo_coeff and self.mo_occ is mf.mo_occ and mo_energy is mf.mo_energy:
            return mf
        return chem.with_orbitals(mf, coeff, self.mo_occ, mo_energy)

    def _run(self, mo_energy=None, mo_coeff=None, **changes):
        """Run DF-MP2 with `changes` to the settings; sets the energies and returns the result."""
        log = logger.new_logger(self)
        cput = (logger.process_clock(), logger.perf_counter())
        integrals = changes.pop("integrals", None) or self._integrals()
        if self.verbose >= logger.INFO:
            self.dump_flags(integrals=integrals)
        given = changes.pop("given", None)
        context = RunContext(team=join_launched_team(self.device, self.simulate))
        self.result = run_mean_field(self._mean_field(mo_coeff, mo_energy), self.settings(**changes),
                                     integrals=integrals, context=context, given=given)
        if self._moved:
            self.result.notes.append(self._moved)
        for name in ("e_ref", "e_corr_os", "e_corr_ss", "e_corr_singles", "reference", "spin_square"):
            setattr(self, name, getattr(self.result, name))
        self.e_hf = self.result.e_hf
        self.e_corr = self._correlation_energy()
        self.converged = True
        for note in self.result.notes:
            log.note("dfmp2: %s", note)
        log.note("E(%s) = %.15g  E_corr = %.15g", self.__class__.__name__, self.e_tot, self.e_corr)
        log.note("E(SCS-%s) = %.15g  E_corr = %.15g", self.__class__.__name__, self.e_tot_scs, self.emp2_scs)
        log.info("E_corr(same-spin) = %.15g", self.e_corr_ss)
        log.info("E_corr(oppo-spin) = %.15g", self.e_corr_os)
        if self.e_corr_singles:  # ROHF (0 with include_singles=False, as PySCF)
            log.info("E_corr(singles) = %.15g", self.e_corr_singles)
        log.timer(self.__class__.__name__, *cput)
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
        team = join_launched_team(self.device, self.simulate)

        def in_scratch():  # PySCF's temporary files (the response's fitting): the run's, removed with it
            with chem.pyscf_scratch():
                return work()
        return in_scratch() if team is None else team.on_root(in_scratch)

    def _raw_integrals(self):
        """(mn|P) in the auxiliary basis of this object's runs, as chem.ThreeCenterIntegrals
        (the orbital response and the gradient need the fitting integrals themselves, not
        Cholesky vectors a density-fitted SCF holds)."""
        integrals = self._integrals()
        if isinstance(integrals, chem.ThreeCenterIntegrals):
            return integrals
        if chem.is_periodic(self._scf):
            raise NotImplementedError("relaxed densities and gradients of periodic mean fields are not implemented")
        auxmol = getattr(self.with_df, "auxmol", None)
        return chem.ThreeCenterIntegrals(self.mol, auxmol.basis if auxmol is not None else self.with_df.auxbasis)

    def _correlation_energy(self):
        """e_corr of the finished run (the SCS classes scale its parts)."""
        return self.result.e_corr

    def make_rdm1(self, relaxed=False, ao_repr=False):
        """The DF-MP2 one-particle density: MO basis (AO with ao_repr), reference occupations plus
        the MP2 correction; RHF [nmo, nmo] (trace = electron count), UHF [2, nmo, nmo] (alpha,
        beta; as PySCF's dfump2_native); built blockwise from the (ia|kb) blocks (no t2 needed).
        relaxed=True: with the orbital response (Z-vector; `dfmp2.response`), the CPHF solved to
        cphf_tol (default: the SCF's conv_tol) in at most cphf_max_cycle iterations."""
        if chem.reference_kind(self._scf) == "rohf":
            raise NotImplementedError(ROHF_DENSITIES_PENDING)
        if relaxed:
            from ..mp2.response import relaxed_density, response_mean_field

            corr, integrals, cphf = self._response_inputs()

            def relaxed_on_this_process():
                with response_mean_field(self._scf, self.settings()) as response_mf:
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
        names a double hybrid (`dfmp2.functionals`; its KS part must be the reference's xc), or
        give c_os and c_ss for a custom one. Runs the energy first if needed."""
        from ..chem.functionals import double_hybrid

        if self.result is None:
            self._run(with_t2=False)
        if not self.result.reference.endswith("ks"):
            raise InputError(f"a double hybrid needs a Kohn-Sham reference, not {self.result.reference.upper()}")
        dh = double_hybrid(xc if xc is not None else self._scf.xc, c_os, c_ss)
        if dh.name != "custom" and _xc_key(dh.xc) != _xc_key(self._scf.xc):
            raise InputError(f"{dh.name}'s KS part is {dh.xc!r}, but the reference used xc {self._scf.xc!r}")
        return self.e_ref + dh.c_os * self.e_corr_os + dh.c_ss * self.e_corr_ss


class Gradients(lib.StreamObject):
    """dE_total/dR of a dfmp2 DF-MP2 object, PySCF's gradient conventions: kernel() -> de
    [natm, 3] (Eh/bohr, atoms in the molecule's order and frame), kept in .de; .base is the
    DF-MP2 object, .mol its molecule. Runs the energy (with the densities it needs) first if
    needed; the CPHF is solved to base.cphf_tol (default: the SCF's conv_tol)."""

    def __init__(self, base):
        self.base, self.mol, self.verbose, self.stdout = base, base.mol, base.verbose, base.stdout
        self.de = None

    def kernel(self, atmlst=None):
        from ..mp2.gradient import nuclear_gradient
        from ..kernels import backend_for
        from ..mp2.response import response_mean_field

        base = self.base
        corr, integrals, cphf = base._response_inputs()

        def gradient_on_this_process():
            with response_mean_field(base._scf, base.settings()) as response_mf:
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


class DFMP2(_DFMP2Base):
    """DF-MP2 on a converged RHF, UHF or ROHF `mf` (or RKS/UKS/ROKS; density-fitted or not;
    periodic at the gamma point) with pyscf.mp.dfmp2.DFMP2's conventions: `kernel()` returns
    (e_corr, t2), `run()` returns self, `with_df` chooses the auxiliary basis, `verbose` and
    `stdout` drive `pyscf.lib.logger`.

    frozen: None, an int (lowest orbitals, of each spin), a list of orbital indices (the same
    for both spins) or, for UHF/ROHF, a pair of lists [[alpha...], [beta...]].
    mo_coeff, mo_occ, mo_energy: orbitals to use instead of the mean field's.
    e_corr_ss is the sum of the alpha-alpha and beta-beta parts; e_corr includes the ROHF
    singles (e_corr_singles; include_singles=False leaves them out). max_memory: MB (default:
    mf.max_memory). auxbasis: the MP2 auxiliary basis (replaces with_df).
    device, precision, simulate, nki_api, transform: where and how the kernels run (dfmp2).
    """

    def __init__(self, mf, frozen=None, mo_coeff=None, mo_occ=None, mo_energy=None, **options):
        super().__init__(mf, frozen, mo_coeff, mo_occ, mo_energy, **options)
        if self.auxbasis is not None:
            self.with_df = _fitting(self._scf, self.auxbasis)
        elif getattr(self._scf, "with_df", None):  # PySCF's choice: the SCF's own fitting (JK-fit)
            self.with_df = self._scf.with_df
        else:
            self.with_df = _fitting(self._scf, chem.pyscf_fitting_choice(self.mol, mp2fit=True))

    def _integrals(self):
        """The three-center integrals of with_df: those it holds already (a density-fitted SCF's,
        a periodic GDF's, or a user's `_cderi`) read as they are, as PySCF's DFMP2 reads them;
        else made in its auxiliary basis (its auxmol's, its auxbasis, or the JK-fit set an unset
        DF object builds). The first time the SCF's own fitting is used, the log names the MP2-fit
        set and how to ask for it."""
        if self.with_df is None:
            raise InputError("with_df is None: set it to a pyscf.df.DF object (or pass auxbasis=)")
        if chem.is_periodic(self._scf):
            chem.check_gamma_point(self._scf)
        if chem.is_periodic(self._scf) or getattr(self.with_df, "_cderi", None) is not None:
            integrals = chem.CholeskyVectors(self.with_df)
        elif getattr(self.with_df, "auxmol", None) is not None:
            integrals = chem.ThreeCenterIntegrals(self.mol, self.with_df.auxmol.basis)  # as asked for (names)
        elif self.with_df.auxbasis is not None:
            integrals = chem.ThreeCenterIntegrals(self.mol, self.with_df.auxbasis)
        else:  # what an unset pyscf.df.DF builds
            integrals = chem.ThreeCenterIntegrals(self.mol, chem.fitting_basis(self.mol, mp2fit=False).basis)
        if self.with_df is getattr(self._scf, "with_df", None) and not self._noted_jk_fit:
            better = chem.fitting_basis(self.mol, mp2fit=True).describe()
            if integrals.basis_name != better:
                logger.note(self, "dfmp2: DF-MP2 uses the mean field's fitting set %s (as PySCF's DFMP2 does); "
                            "the MP2-fit set %s is made for MP2 and more accurate: DFMP2(mf, auxbasis=%r) or "
                            "pt.with_df = pyscf.df.DF(mol, auxbasis=%r)", integrals.basis_name, better, better, better)
            self._noted_jk_fit = True
        return integrals

    def density_fit(self, auxbasis=None, with_df=None):
        """A new DFMP2 with this one's options and orbitals, as PySCF's MP2.density_fit makes it:
        `with_df` if given (else PySCF's choice), set to `auxbasis` (a copy of it if the basis
        differs; None: the JK-fit set an unset DF object builds, as in PySCF)."""
        new = DFMP2(self._scf, self.frozen, self.mo_coeff, self.mo_occ, self.mo_energy)
        for name in _OPTIONS:
            setattr(new, name, getattr(self, name))
        if with_df is not None:
            new.with_df = with_df
        if new.with_df.auxbasis != auxbasis:
            new.with_df = new.with_df.copy()
            new.with_df.auxbasis = auxbasis
        return new

    def kernel(self, mo_energy=None, mo_coeff=None, eris=None, with_t2=IF_ROOM):
        """Compute the DF-MP2 correlation energy (Eh); returns (e_corr, t2) as PySCF does.
        t2: [nocc, nocc, nvir, nvir] of the active orbitals (restricted) or (t2aa, t2ab, t2bb)
        (unrestricted; ROHF: semicanonical orbitals); with_t2 IF_ROOM (default) keeps it when the
        memory budget allows it (else None and a note says why), True insists (MemoryError if it
        does not fit), False skips it. eris: from ao2mo() (or PySCF's, anything with .ovL):
        the (ia|P) integrals are taken from it instead of being made."""
        given = notes = None
        if eris is not None:  # vouched for as ao2mo(ovL=FILE) is (`_check_eris`)
            given = _ovl_per_spin(eris.ovL)
            notes = self._check_eris(eris, self._integrals(), mo_coeff, getattr(eris, "source", None) or "eris")
        self._run(mo_energy, mo_coeff, with_t2=with_t2, given=given)
        if notes:
            self.result.notes.extend(notes)
            for note in notes:
                logger.note(self, "dfmp2: %s", note)
        self.t2 = self.result.correlation.t2
        return self.e_corr, self.t2

    def ao2mo(self, mo_coeff=None, ovL=None, ovL_to_save=None):
        """The whitened (ia|P) integrals of the active orbitals as PySCF's eris: `.ovL` [nocc * nvir,
        naux] (a list of two for UHF/ROHF). ovL: take them as given (an array, a list of two, or
        the path of an HDF5 file written with ovL_to_save, PySCF's or dfmp2's); ovL_to_save: also
        write them to that HDF5 file (datasets 'ovL', or 'ovL0' and 'ovL1')."""
        integrals = self._integrals()
        if ovL is not None:
            if isinstance(ovL, (str, os.PathLike)):
                eris = ThreeCenterMO(*open_ovl(ovL), source=f"ovL {display(ovL)}")
                try:
                    self._check_eris(eris, integrals, mo_coeff, f"ovL {display(ovL)}")
                except BaseException:
                    eris.close()
                    raise
                return eris
            return ThreeCenterMO(ovL)
        mf = self._mean_field(mo_coeff)
        identity, orbitals = self._ovl_identity(integrals, mo_coeff)
        if ovL_to_save is None:  # in memory
            ovl = three_center_of_mean_field(mf, self.settings(), integrals)
            return ThreeCenterMO(ovl[0] if len(ovl) == 1 else ovl, identity=identity, orbitals=orbitals)
        write_ovl(ovL_to_save, lambda out: three_center_of_mean_field(mf, self.settings(), integrals, out=out),
                  identity, orbitals, directories=[self.checkpoint])
        return ThreeCenterMO(*open_ovl(ovL_to_save), source=f"ovL {display(ovL_to_save)}")

    def _ovl_identity(self, integrals, mo_coeff=None) -> tuple:
        """(identity, [(C_occ, C_vir) per spin]) of the (ia|P) this object makes: the molecule
        (atoms in bohr, basis and its AO labels), the auxiliary basis, the active orbitals'
        indices (frozen); and the active orbitals themselves, compared numerically on reading."""
        import hashlib

        mol = self.mol
        coeffs = np.asarray(self.mo_coeff if mo_coeff is None else mo_coeff)
        coeffs = coeffs[None] if coeffs.ndim == 2 else coeffs
        active = self._active()
        if len(coeffs) != len(active):  # ROHF: the same orbitals for both spins (semicanonical when made)
            coeffs = np.array([coeffs[0]] * len(active))
        identity = {
            "kind": "ovL", "atoms": [[mol.atom_symbol(i), *np.round(mol.atom_coord(i), 8).tolist()]
                                     for i in range(mol.natm)],
            "basis": chem.basis_name(mol), "nao": int(mol.nao_nr()),
            "ao_labels": hashlib.sha256("\n".join(mol.ao_labels()).encode()).hexdigest()[:16],
            "auxbasis": str(integrals.auxbasis), "naux": int(integrals.naux),
            "active": [[occ.tolist(), vir.tolist()] for occ, vir, _ in active]}
        return identity, [(c[:, occ], c[:, vir]) for c, (occ, vir, _) in zip(coeffs, active)]

    def _check_eris(self, eris, integrals, mo_coeff, label) -> list:
        """Vouch for (ia|P) read back (ao2mo(ovL=FILE), kernel(eris=)): made by dfmp2 for this
        molecule, bases, active orbitals and orbitals (identity, then orbitals to 1e-6 up to their
        signs), else InputError naming the difference; made elsewhere (PySCF's ovL, an array): its
        shapes against the active spaces and the auxiliary basis, and a note saying that only
        they could be checked. Returns the notes."""
        blocks = _ovl_per_spin(eris.ovL)
        identity, orbitals = self._ovl_identity(integrals, mo_coeff)
        if getattr(eris, "identity", None) is not None:
            reason = mismatch(eris.identity, identity)
            if reason is None:
                for (occ, vir), (occ_now, vir_now) in zip(eris.orbitals, orbitals):
                    worst = max(_largest_change(occ, occ_now), _largest_change(vir, vir_now))
                    if worst > 1e-6:
                        reason = (f"it was made with other orbitals (a coefficient differs by {worst:.2g}; a new SCF "
                                  "may rotate them)")
                        break
            if reason is not None:
                raise InputError(f"{label}: {reason}; make them from these orbitals with ao2mo()")
            return []
        spaces = [(len(occ), len(vir)) for occ, vir, _ in self._active()]
        if len(blocks) != len(spaces) or any(
                len(b.shape) != 2 or b.shape[0] != o * v or not 0 < b.shape[1] <= integrals.naux
                for b, (o, v) in zip(blocks, spaces)):
            raise InputError(f"{label}: shapes {[tuple(b.shape) for b in blocks]} are not [nocc * nvir, naux <= "
                             f"{integrals.naux}] of the active orbitals {spaces}: made with other orbitals, frozen "
                             "orbitals or auxiliary basis")
        return [f"{label} was not made by dfmp2 (it records no orbitals): only its shapes could be checked against "
                "this molecule's active orbitals and auxiliary basis"]

    def make_rdm1(self, t2=None, ao_repr=False, with_frozen=True, relaxed=False):
        """The unrelaxed DF-MP2 one-particle density with pyscf.mp.dfmp2's signature: MO basis
        [nmo, nmo] (AO with ao_repr; the active orbitals only with with_frozen=False), built
        blockwise from (ia|kb), or by PySCF's formula from `t2` when one is given. UHF: the tuple
        (alpha, beta), as PySCF's DFUMP2; relaxed=True comes with the analytic gradients."""
        from pyscf.mp import mp2, ump2

        kind = chem.reference_kind(self._scf)
        if kind == "rohf":
            raise NotImplementedError(ROHF_DENSITIES_PENDING)
        if t2 is not None:
            return (mp2 if kind == "rhf" else ump2).make_rdm1(self, t2, ao_repr=ao_repr, with_frozen=with_frozen)
        dms = super().make_rdm1(relaxed=relaxed)
        masks, coeffs = self.get_frozen_mask(), np.asarray(self.mo_coeff)
        if kind == "rhf":
            dms, masks, coeffs = dms[None], [masks], coeffs[None]
        out = []
        for dm, mask, coeff in zip(dms, masks, coeffs):
            keep = np.ones(len(dm), dtype=bool) if with_frozen else np.asarray(mask)
            dm, coeff = dm[np.ix_(keep, keep)], coeff[:, keep]
            out.append(coeff @ dm @ coeff.T if ao_repr else dm)
        return out[0] if kind == "rhf" else tuple(out)

    def make_rdm2(self, t2=None, ao_repr=False):
        """The unrelaxed MP2 two-particle density of a closed-shell (RHF) reference from t2
        (default: the kept one), as PySCF's make_rdm2 builds it ([nmo]*4, O(nmo^4) memory)."""
        from pyscf.mp import mp2

        if chem.reference_kind(self._scf) != "rhf":
            raise NotImplementedError("the MP2 2-RDM of open-shell references is not implemented in dfmp2")
        if t2 is None:
            if self.t2 is None:
                self.kernel(with_t2=True)
            t2 = self.t2
        return mp2.make_rdm2(self, t2, ao_repr=ao_repr)


DFUMP2 = DFROMP2 = DFMP2  # the method follows the mean field (UHF: DFUMP2's energies; ROHF: DFROMP2's)


class ThreeCenterMO:
    """The whitened (ia|P) integrals of one run's active orbitals, PySCF's eris layout: `ovL`
    [nocc * nvir, naux] (restricted) or [ovL_alpha, ovL_beta]; arrays or HDF5 datasets (then
    `close()` closes their file)."""

    def __init__(self, ovL, handle=None, identity=None, orbitals=None, source=None):  # noqa: N803 (PySCF's name)
        self.ovL = ovL
        self._handle = handle
        self.source = source  # where they were read from, for messages ("ovL FILE"), or None
        self.identity = identity  # what they were made from (DFMP2._ovl_identity); None: not made by dfmp2
        self.orbitals = orbitals  # [(C_occ, C_vir) per spin] they were made from

    @property
    def naux(self):
        return int(_ovl_per_spin(self.ovL)[0].shape[-1])

    def close(self):
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def _largest_change(before, now) -> float:
    """The largest change of a coefficient between two orbital sets [nao, n], each orbital's
    sign as `now` has it (a sign does not change (ia|P)'s energies); inf if the shapes differ."""
    before, now = np.asarray(before), np.asarray(now)
    if before.shape != now.shape:
        return float("inf")
    if before.size == 0:
        return 0.0
    signs = np.where(np.einsum("mk,mk->k", before, now) < 0, -1.0, 1.0)
    return float(np.abs(before * signs - now).max())


def _ovl_per_spin(ovl) -> list:
    """[ovL] of a restricted eris, [ovL_alpha, ovL_beta] of an unrestricted one."""
    if isinstance(ovl, (list, tuple)):
        return list(ovl)
    if getattr(ovl, "ndim", 2) == 3:  # a stacked [2, nocc * nvir, naux]
        return [ovl[0], ovl[1]]
    return [ovl]


class NativeDFMP2(_DFMP2Base):
    """pyscf.mp.dfmp2_native's conventions (`dfmp2.native.DFMP2`): DFMP2(mf, frozen, auxbasis),
    the auxiliary basis is the MP2-fit set for the orbital basis unless `auxbasis` names one
    (the mean field's with_df is not used), `kernel()` returns e_corr and keeps no t2, and the
    object can be used in a with-block. e_corr = ps E_os + pt E_ss (1, 1 for MP2; the SCS
    classes scale them), its density that of the same scaled energy."""

    _keys = _DFMP2Base._keys | {"ps", "pt", "cphf_max_cycle", "cphf_tol", "e_scf"}

    def __init__(self, mf, frozen=None, auxbasis=None, **options):
        super().__init__(mf, frozen, auxbasis=auxbasis, **options)
        self.e_scf = mf.e_tot
        self.ps = 1.0  # opposite-spin scaling of e_corr and of the density
        self.pt = 1.0  # same-spin scaling
        self.cphf_max_cycle = 100  # the relaxed density's CPHF
        self.cphf_tol = getattr(mf, "conv_tol", 1e-9)

    @property
    def e_tot(self):
        return None if self.e_corr is None else self.e_scf + self.e_corr

    def kernel(self):
        """The (scaled) DF-MP2 correlation energy, Eh."""
        return self.calculate_energy()

    def calculate_energy(self):
        self._run(with_t2=False)
        return self.e_corr

    def _correlation_energy(self):
        """ps E_os + pt E_ss (+ the ROHF singles)."""
        return self.ps * self.e_corr_os + self.pt * self.e_corr_ss + self.e_corr_singles

    def _rdm1_scaling(self):
        return (self.ps, self.pt)

    def make_rdm1_unrelaxed(self, ao_repr=False):
        return self.make_rdm1(relaxed=False, ao_repr=ao_repr)

    def make_rdm1_relaxed(self, ao_repr=False):
        return self.make_rdm1(relaxed=True, ao_repr=ao_repr)


class NativeSCSMP2(NativeDFMP2):
    """Spin-component-scaled DF-MP2 with pyscf.mp.dfmp2_native's conventions: e_corr =
    ps E_os + pt E_ss (default 6/5 and 1/3, Grimme's) and the density of that energy."""

    def __init__(self, mf, ps=6 / 5, pt=1 / 3, *args, **kwargs):
        super().__init__(mf, *args, **kwargs)
        self.ps = ps
        self.pt = pt


_OPTIONS = ("device", "precision", "simulate", "nki_api", "transform", "allow_non_aufbau", "max_memory",
            "checkpoint", "checkpoint_allow_other_files", "force_outcore", "include_singles", "verbose", "stdout")


def _fitting(mf, auxbasis):
    """PySCF's density-fitting object for `mf` in `auxbasis`: pyscf.df.DF, or for a periodic mean
    field the Gaussian density fitting (pyscf.pbc.df.GDF) of its cell."""
    if chem.is_periodic(mf):
        from pyscf.pbc import df as pbc_df

        fitting = pbc_df.GDF(mf.mol)
        fitting.auxbasis = auxbasis
        return fitting
    from pyscf import df

    return df.DF(mf.mol, auxbasis=auxbasis)


def _host_mean_field(mf):
    """A gpu4pyscf mean field (`mf.to_gpu()`) is moved to the CPU with its own `to_cpu()` (the
    integrals and orbitals dfmp2 reads are host arrays); returns (mf, note or None)."""
    module = type(mf).__module__ or ""
    if module.startswith("gpu4pyscf"):
        if not hasattr(mf, "to_cpu"):
            raise InputError(f"{type(mf).__name__} from gpu4pyscf has no to_cpu(): pass the PySCF (CPU) mean field")
        return mf.to_cpu(), f"gpu4pyscf mean field {type(mf).__name__} moved to the CPU with to_cpu()"
    return mf, None


def _xc_key(xc: str) -> str:
    return "".join(str(xc).upper().split())


__all__ = ["DFMP2", "DFUMP2", "DFROMP2", "ThreeCenterMO", "NativeDFMP2", "NativeSCSMP2", "IF_ROOM"]


def use_dfmp2_jk(mf, device="cpu", precision=None, max_memory=None):
    """Make a density-fitted PySCF mean field `mf` (RHF, UHF, ROHF, RKS, UKS, ROKS) build its
    Coulomb and exchange matrices with dfmp2 on `device` (cpu or cuda), as gpu4pyscf's to_gpu()
    moves a whole SCF: PySCF's driver (DIIS, damping, convergence) and the exchange-correlation
    quadrature stay as they are. precision: mixed (default) or fp64 (`dfmp2.scf`); max_memory:
    MB for the process (default: mf.max_memory). The JK-fit set is mf.with_df's. Returns mf
    (changed in place); dfmp2's DFMP2 on it records scf_backend "torch".

        mf = dfmp2.use_dfmp2_jk(scf.RHF(mol).density_fit(), device="cpu").run()
    """
    from ..kernels import get_backend
    from ..kernels.protocol import FittedBuildsBackend
    from ..chem.jk import FittedCoulombExchange, check_scf_precision

    if getattr(mf, "with_df", None) is None:
        raise InputError("use_dfmp2_jk needs a density-fitted mean field: call mf.density_fit() first")
    if precision is not None:
        check_scf_precision(precision)  # before any integral is computed
    backend = get_backend(device)
    if not isinstance(backend, FittedBuildsBackend):
        raise InputError(f"the {backend.name} backend ({device}) has no SCF builds")
    integrals = chem.jk_fitting_integrals(mf.mol, chem.jk_auxbasis_of(mf))
    builds = FittedCoulombExchange(backend, integrals, precision,
                                   max_memory if max_memory is not None else getattr(mf, "max_memory", None))
    return chem.use_fitted_builds(mf, builds)
