"""The result of a run (`DFMP2Result`): built once, read by the CLI's report and the PySCF classes."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import chem
from ..chem.functionals import DoubleHybrid
from ..kernels.protocol import BackendRecord
from ..mp2.pipeline import CorrelationEnergy
from ..mp2.steps import mp2_density_correction
from ..util.cpu_config import configuration_record
from ..util.system_memory import MB
from ..util.version import __version__

def cpu_record() -> dict:
    """cpu_configuration: the CPU, dfmp2's choices for it, the variables set (util.cpu_config), and
    `gemm`, which library ran the CPU products of each precision, its kernels and rate (kernels.torch.cpu_gemm)."""
    from ..kernels.torch import cpu_gemm  # (torch: loaded by the run itself, not by importing the driver)

    return {**configuration_record(), "gemm": cpu_gemm.record()}


MODEL_NOTE = ("calibrated MODEL from the emulator trace, not a measurement: per call launch + host "
              "transfer + max(tensor_engine, dma, vector, scalar); the engine entries of the "
              "breakdown are busy times that overlap (see docs/benchmarks.md, Calibration)")


PEAK_MODEL_NOTE = ("peak model (uncalibrated): the emulator trace at published peaks, perfect overlap, "
                   "no launch cost; not a measurement")


@dataclass(frozen=True)
class DFMP2Result:
    """Energies in Hartree, timings in seconds, and a record of what ran where."""

    e_ref: float  # the reference's total energy: E(HF), or E(KS) for rks/uks/roks
    correlation: CorrelationEnergy  # the correlation's part (`pipeline.CorrelationEnergy`)
    ran: BackendRecord  # the backend's part: what ran where (`protocol.BackendRecord`; device, kernels, models)
    reference: str  # rhf, uhf, rohf, or rks, uks, roks (Kohn-Sham orbitals)
    basis: str
    auxbasis: str
    scf: str
    scf_auxbasis: str | None
    formula: str = ""
    timings: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)  # announcements (e.g. a disputed nki/target pair)
    spin_square: float = 0.0  # <S^2> of the reference
    xc: str | None = None  # the functional of a Kohn-Sham reference
    auxbasis_generated: dict = field(default_factory=dict)  # "scf"/"mp2" -> elements with a generated set
    auxbasis_sources: dict = field(default_factory=dict)  # "scf"/"mp2" -> {element: where its set came from}
    ecp: dict = field(default_factory=dict)  # element -> {"name", "core_electrons"} of the ECPs used
    double_hybrid: DoubleHybrid | None = None  # a double-hybrid run: E = E_KS + c_os E_os + c_ss E_ss
    mean_field: object = None  # the PySCF SCF object of a run_xyz run (for densities / orbitals)
    peak_rss_bytes: int = 0  # the process's peak resident memory at the end of the run
    # the CPU, dfmp2's choices for it and the threading variables set (util.cpu_config), as the run had them
    cpu_configuration: dict = field(default_factory=lambda: cpu_record())
    scf_record: dict = field(default_factory=dict)  # the SCF's part: what built its J and K (`scf_record`)
    screening: dict = field(default_factory=dict)  # "mp2"/"scf" -> the --screening choice and what it kept
    properties: dict = field(default_factory=dict)  # from the relaxed density: {"dipole": [x, y, z] a.u.}
    gradient: object = None  # dE_total/dR [natm, 3] (Eh/bohr) when asked for (settings.gradient)
    gradient_jk: dict = None  # what built the orbital response's J/K (scf.BuildRecord.as_dict)

    def make_rdm1(self, mo_coeff, mo_occ, ao_repr=False):
        """The unrelaxed MP2 1-RDM of a run made with_rdm1, in the MO basis (or AO with ao_repr):
        the reference occupations (frozen orbitals 2 or 0; per spin 1 or 0) plus the MP2
        correction on the active orbitals. RHF: [nmo, nmo], trace = electron count; UHF:
        [2, nmo, nmo], (alpha, beta) (PySCF dfmp2_native's and dfump2_native's conventions)."""
        spins = self.correlation.rdm1_active
        coeffs, occs = (np.asarray(mo_coeff)[None], np.asarray(mo_occ)[None]) if len(spins) == 1 else (
            np.asarray(mo_coeff), np.asarray(mo_occ))
        dms = []
        for (occ_index, vir_index, p_oo, p_vv), coeff, occ in zip(spins, coeffs, occs):
            dm = mp2_density_correction(len(occ), occ_index, vir_index, p_oo, p_vv) + np.diag(
                np.asarray(occ, dtype=np.float64))
            dms.append(coeff @ dm @ coeff.T if ao_repr else dm)
        return dms[0] if len(spins) == 1 else np.array(dms)

    def natural_orbitals(self) -> tuple:
        """(occupations [nmo], orbitals [nao, nmo]) of the unrelaxed MP2 density of a run_xyz run
        made with_rdm1 (UHF: of the spin-summed density), in the AO basis."""
        from ..mp2.orbitals import natural_orbitals

        mf = self.mean_field
        return natural_orbitals(self.make_rdm1(mf.mo_coeff, mf.mo_occ), np.asarray(mf.mo_coeff),
                                chem.overlap_matrix(mf.mol))

    def write_molden(self, path, orbitals, occupations) -> None:
        """Orbitals [nao, nmo] with their occupations as a Molden file of this run's molecule."""
        chem.write_molden(self.mean_field.mol, path, orbitals, occupations)

    # what ran where, read from the backend's part
    device = property(lambda self: self.ran.device)
    device_description = property(lambda self: self.ran.description)
    precision = property(lambda self: self.ran.precision)
    backend = property(lambda self: self.ran.name)
    transform = property(lambda self: self.ran.transform)  # AO->MO: fp64 (cpu, cuda), exact or fp32 (Trainium)
    simulated = property(lambda self: self.ran.simulated)
    kernel_specializations = property(lambda self: self.ran.specializations)  # kernel -> argument shapes
    modelled_seconds = property(lambda self: self.ran.modelled_seconds)  # PEAK MODEL (uncalibrated), or None
    modelled = property(lambda self: self.ran.modelled)  # calibrated MODEL per target, or None
    trace = property(lambda self: self.ran.trace)
    nki_api = property(lambda self: self.ran.nki_api)  # trn1/trn2/trn3: the NKI release emulated or installed
    lnc = property(lambda self: self.ran.lnc)  # trn1/trn2/trn3: the logical NeuronCore degree compiled at
    neuron_versions = property(lambda self: self.ran.neuron_versions)  # Trainium host: nki, neuronx-cc, ...

    e_corr = property(lambda self: self.correlation.e_corr)
    e_corr_os = property(lambda self: self.correlation.e_corr_os)
    e_corr_ss = property(lambda self: self.correlation.e_corr_ss)
    e_corr_singles = property(lambda self: self.correlation.e_corr_singles)
    e_scs = property(lambda self: self.correlation.e_scs)
    @property
    def e_pt2(self):
        """A double hybrid's scaled MP2 part, c_os E_os + c_ss E_ss (Eh); None otherwise."""
        dh = self.double_hybrid
        return None if dh is None else dh.pt2_energy(self.e_corr_os, self.e_corr_ss)

    @property
    def e_tot(self):
        """E_ref + E_corr, or for a double hybrid E_KS + E_PT2."""
        return self.e_ref + (self.correlation.e_corr if self.double_hybrid is None else self.e_pt2)

    # E(HF) only for Hartree-Fock references: a KS energy is never reported as E(HF)
    e_hf = property(lambda self: None if self.reference.endswith("ks") else self.e_ref)
    kernels = property(lambda self: self.correlation.kernels)  # kernel name -> call count

    def as_dict(self) -> dict:
        """The JSON record, flattened once from the parts (the correlation, the backend's, the SCF's)."""
        corr = self.correlation
        record = {
            "formula": self.formula,
            "e_ref": self.e_ref, "e_hf": self.e_hf, "xc": self.xc, "e_corr": self.e_corr, "e_corr_os": self.e_corr_os,
            "e_corr_ss": self.e_corr_ss, "e_corr_singles": self.e_corr_singles,
            "e_scs": self.e_scs, "e_tot": self.e_tot, "singles_included": self.correlation.singles_included,
            "method": corr.method, "c_os": corr.c_os, "laplace": corr.laplace,
            "reference": self.reference, "spin_square": self.spin_square,
            "nbasis": corr.nao, "nocc": _per_spin(corr.nocc), "nvir": _per_spin(corr.nvir),
            "naux": corr.naux, "nfrozen": _per_spin(corr.nfrozen), "basis": self.basis, "auxbasis": self.auxbasis,
            "scf": self.scf, "scf_auxbasis": self.scf_auxbasis, **self.scf_record,
            "device": self.device, "device_description": self.device_description,
            "precision": self.precision, "backend": self.backend, "transform": self.transform,
            "kernels": dict(self.kernels),
            "screening": {k: dict(v) for k, v in self.screening.items()},
            "metric_factorization": corr.metric,
            "memory": memory_record(corr.plan, self.peak_rss_bytes),
            "io": dict(corr.io),
            "checkpoint": corr.checkpoint,
            "distributed": corr.distributed,
            "timings": dict(self.timings), "version": __version__, "cpu_configuration": self.cpu_configuration,
            "simulated": self.simulated, "notes": list(self.notes),
            "auxbasis_generated": dict(self.auxbasis_generated),
            "auxbasis_sources": {k: dict(v) for k, v in self.auxbasis_sources.items()},
            "ecp": {k: dict(v) for k, v in self.ecp.items()},
            **{name: value for name, value in self.properties.items()},
            **({"gradient": np.asarray(self.gradient).tolist(), "atoms": chem.atom_symbols(self.mean_field.mol),
                "gradient_jk": dict(self.gradient_jk or {})} if self.gradient is not None else {}),
            "kernel_specializations": {k: [[list(a) if isinstance(a, tuple) else a for a in s]
                                           for s in sorted(v, key=repr)]
                                       for k, v in self.kernel_specializations.items()},
        }
        if self.double_hybrid is not None:
            dh = self.double_hybrid
            record.update({"xc": dh.name, "xc_ks": dh.xc, "c_os": dh.c_os, "c_ss": dh.c_ss,
                           "xc_citation": dh.citation, "e_ks": self.e_ref, "e_pt2": self.e_pt2})
        if self.nki_api:
            from ..kernels.nki.support import NEURON_SDK_OF_NKI

            record.update(nki_api=self.nki_api, neuron_sdk=NEURON_SDK_OF_NKI.get(self.nki_api), lnc=self.lnc)
        if self.neuron_versions:
            record["neuron_versions"] = dict(self.neuron_versions)
        if self.modelled_seconds is not None:
            record.update(model_record(self.modelled, self.modelled_seconds), trace=self.trace)
        return record


def memory_record(plan, peak_rss_bytes) -> dict:
    """The JSON record's "memory" block: the plan (MB, blocks, storage), what set its budget
    (--max-memory, or the limit that allowed least: `run.budget.memory_budget`), every limit found
    with what it allows (limits), and the peak resident set."""
    return {"budget_mb": plan.budget / MB, "budget_source": plan.budget_source,
            "limits": list(plan.budget_limits), "storage": plan.storage,
            "aux_block": plan.aux_block, "occ_block": plan.occ_block, "slab_rows": plan.slab_rows,
            "baseline_mb": plan.baseline / MB, "peak_rss_mb": peak_rss_bytes / MB}


def model_record(modelled, modelled_seconds, what="") -> dict:
    """The JSON record's MODEL fields of an emulated run, each with its note (what: e.g. which
    passes the model covers)."""
    return {"modelled": modelled, "modelled_note": MODEL_NOTE + (f"; {what}" if what else ""),
            "modelled_seconds": dict(modelled_seconds),
            "modelled_seconds_note": PEAK_MODEL_NOTE + (f" ({what})" if what else "")}


def _per_spin(value):
    """An int (restricted) or [alpha, beta] (unrestricted) for the JSON record."""
    return list(value) if isinstance(value, tuple) else value
