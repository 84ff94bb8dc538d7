"""The report a command prints: the run's summary and the benchmark's, from the result records
(`DFMP2Result.as_dict`, the bench record). Formatting only; nothing here computes. Printed
through `appends.write_stdout` (a full standard output is then one line, `signals.shown`)."""

from __future__ import annotations

from ..kernels import is_host
from ..util.appends import write_stdout


def print_summary(r):
    kernels = ", ".join(f"{name} x{count}" for name, count in sorted(r["kernels"].items()))
    def spins(value):  # an int (RHF) or [alpha, beta]
        return f"{value[0]}a/{value[1]}b" if isinstance(value, list) else f"{value}"

    frozen = f" ({spins(r['nfrozen'])} frozen)" if r["nfrozen"] not in (0, [0, 0]) else ""
    reference = r["reference"].upper() + (f", <S^2> {r['spin_square']:.4f}" if r["reference"] != "rhf" else "")
    scf = r["scf"] + (f" (JK-fit: {r['scf_auxbasis']})" if r["scf_auxbasis"] else "")
    mem = r["memory"]
    lines = [
        f"dfmp2 {r['version']}: DF-MP2 (RI-MP2) correlation energy",
        f"  molecule    {r['formula']} from {r['molecule']}, charge {r['charge']}, 2S {r['spin']}",
        f"  basis       {r['basis']}, MP2 auxiliary basis {r['auxbasis']}, SCF {scf}",
        *([f"  ecp         " + ", ".join(f"{el}: {e['name']} ({e['core_electrons']} core electrons)"
                                      for el, e in sorted(r["ecp"].items()))] if r.get("ecp") else []),
        f"  reference   {reference}",
        *_scf_lines(r),
        f"  sizes       nbasis {r['nbasis']}, nocc {spins(r['nocc'])}{frozen}, nvir {spins(r['nvir'])}, "
        f"naux {r['naux']}",
        f"  device      {r['device']} ({r['device_description']}), {r['backend']} backend, {r['precision']}, "
        f"transform {r['transform']}",
        *([f"  nki         {r['nki_api']}" + (f" (Neuron SDK {r['neuron_sdk']})" if r.get("neuron_sdk") else "")
           + (f", kernels compiled at LNC={r['lnc']}" if r.get("lnc") else "")] if r.get("nki_api") else []),
        *[f"  note        {note}" for note in r.get("notes", [])],
        f"  kernels     {kernels}",
        f"  metric      {r['metric_factorization']}",
        f"  memory      budget {mem['budget_mb']:.0f} MB (process; {mem['baseline_mb']:.0f} MB resident before "
        f"MP2, peak {mem['peak_rss_mb']:.0f} MB), (ia|P) in {mem['storage']}, aux block {mem['aux_block']}, "
        f"occ block {mem['occ_block']}",
        *_checkpoint_lines(r.get("checkpoint")),
        *_rank_lines(r.get("distributed")),
        "",
        f"  {'E(' + r['reference'].upper() + ')':17s} {r['e_ref']:20.12f} Eh"
        + (f" ({r['xc']})" if r.get("xc") else ""),
        f"  E(corr, os)       {r['e_corr_os']:20.12f} Eh",
        *([f"  E(corr, ss)       {r['e_corr_ss']:20.12f} Eh"] if r['e_corr_ss'] is not None else []),
        *([f"  E(corr, singles)  {r['e_corr_singles']:20.12f} Eh"] if r["reference"] == "rohf" else []),
        f"  E(corr)           {r['e_corr']:20.12f} Eh" + _method_note(r),
        *([f"  E(corr, SCS)      {r['e_scs']:20.12f} Eh"] if r['e_scs'] is not None else []),
        *_laplace_lines(r.get("laplace")),
        *([f"  E(PT2)            {r['e_pt2']:20.12f} Eh  = {r['c_os']:g} E(os)" + (f" + {r['c_ss']:g} E(ss)" if r['c_ss'] else "") + " "
           f"({r['xc']}: {r['xc_citation']})"] if r.get("e_pt2") is not None else []),
        f"  E(total)          {r['e_tot']:20.12f} Eh" + ("  = E(KS) + E(PT2)" if r.get("e_pt2") is not None else ""),
        *([f"  dipole (relaxed)  {r['dipole'][0]:12.6f} {r['dipole'][1]:12.6f} {r['dipole'][2]:12.6f} a.u."]
          if r.get("dipole") else []),
        *_gradient_lines(r.get("gradient"), r.get("atoms")),
        *_optimization_lines(r),
        "",
        "  timings (s)  " + "  ".join(f"{k} {v:.3f}" for k, v in r["timings"].items()),
    ]
    lines += _model_lines(r, scale=1e3, unit="ms")
    if r.get("kernel_specializations"):
        lines.append("  kernel specializations: " + ", ".join(
            f"{k} x{len(v)}" for k, v in sorted(r["kernel_specializations"].items())))
    write_stdout("\n".join(lines))


def _method_note(r) -> str:
    """After E(corr): what it is when it is not E_os + E_ss (SOS-MP2)."""
    if r.get("method") == "sos-mp2" and r.get("e_pt2") is None:
        return f"  = {r['c_os']:g} E(os)" + (" + E(singles)" if r["reference"] == "rohf" else "") + " (SOS-MP2)"
    return ""


def _laplace_lines(laplace):
    """E_os through the Laplace transform: the quadrature and the bound on E_os's error."""
    if not laplace:
        return []
    return [f"  Laplace           {laplace['points']} points on [{laplace['x_min']:.4g}, {laplace['x_max']:.4g}] Eh, "
            f"|E(os) error| <= {laplace['e_os_error_bound']:.2e} Eh (relative bound {laplace['error_bound']:.2e})"]


def _optimization_lines(r):
    """`dfmp2 optimize`: steps, energy change, and the files written."""
    if "energies" not in r:
        return []
    replayed = f", {r['steps_replayed']} from the checkpoint" if r["steps_replayed"] else ""
    return ["", f"  optimised   converged in {r['steps']} steps{replayed}: E {r['energies'][0]:.10f} -> "
                f"{r['e_tot']:.10f} Eh ({r['e_tot'] - r['energies'][0]:+.3e})",
            f"  written     {r['optimized_xyz']} (geometry), {r['trajectory']} (trajectory)"]


def _gradient_lines(gradient, atoms):
    """The analytic gradient table (Eh/bohr), one row per atom in the input's order."""
    if gradient is None:
        return []
    rows = [f"  {k + 1:4d} {symbol:3s} {g[0]:16.10f} {g[1]:16.10f} {g[2]:16.10f}"
            for k, (symbol, g) in enumerate(zip(atoms, gradient))]
    return ["", "  gradient dE/dR (Eh/bohr)      x                y                z", *rows]


def _scf_lines(r):
    """The SCF's J/K builds: who ran them, in which precision, iterations and seconds."""
    if r.get("scf_backend") is None:
        return []
    line = f"  scf builds  {r['scf_backend']}, {r['scf_precision']}"
    if r.get("scf_iterations") is not None:
        line += f", {r['scf_iterations']} iterations"
    builds = r.get("scf_builds")
    if builds:
        kinds = ", ".join(f"{builds[k + '_builds']} {k}" for k in ("fp32", "incremental", "fp64", "exact", "coulomb")
                          if builds.get(k + "_builds"))
        line += (f"; {builds['builds']} builds ({kinds}), {sum(builds['build_seconds']):.2f} s, set-up "
                 f"{builds['setup_seconds']:.2f} s, B as {builds['storage']}")
        if builds.get("modelled_build_seconds"):
            line += "; MODELLED builds " + ", ".join(f"{t} {sum(v) * 1e3:.1f} ms" for t, v in
                                                   builds["modelled_build_seconds"].items()) + " (a model)"
    return [line]


def _checkpoint_lines(ck):
    if not ck:
        return []
    reused = [name for name, key in (("SCF", "reused_scf"), ("B", "reused_B")) if ck.get(key)]
    if ck["reused_pair_tasks"]:
        reused.append(f"{ck['reused_pair_tasks']}/{ck['pair_tasks']} pair blocks")
    return [f"  checkpoint  {ck['directory']} (reused: {', '.join(reused) or 'nothing, new'})"]


def _rank_lines(distributed):
    if not distributed:
        return []
    lines = [f"  ranks       {distributed['ranks']} ({distributed['backend']}); per rank:"]
    for r in distributed["per_rank"] or []:
        lines.append(f"    rank {r['rank']}: {r['pair_tasks']} pair blocks in {r['pair_seconds']:.2f} s, "
                     f"{r['aux_functions']} aux functions, sent {r['bytes_sent'] / 1e6:.1f} MB, "
                     f"received {r['bytes_received'] / 1e6:.1f} MB, peak {r['peak_rss_mb']:.0f} MB")
    return lines


def print_bench(r):
    s = r["shape"]
    name = f"{s['name']} " if s.get("name") else ""
    lines = [
        f"dfmp2 {r['versions']['dfmp2']} bench: synthetic DF-MP2, {name}nbasis {s['nbasis']}, "
        f"nocc {s['nocc']}, nvir {s['nvir']}, naux {s['naux']}, seed {s['seed']}",
        f"  device      {r['device']} ({r['device_description']}), {r['backend']} backend, {r['precision']}, "
        f"transform {r['transform']}",
        f"  integrals   synthetic (mn|P) made on "
        f"{'the host' + ('' if is_host(r['device']) else ', uploaded') if is_host(r['integrals_made_on']) else 'the GPU'}",
        *[f"  note        {note}" for note in r.get("notes", [])],
        f"  E(corr)     {r['e_corr']:.12f} Eh (os {r['e_corr_os']:.10f}, ss {r['e_corr_ss']:.10f})",
        "",
        f"  {'stage':15s} {'seconds':>10s} {'GFLOP':>10s} {'TFLOPS':>8s}",
    ]
    for stage, v in r["stages"].items():
        tflops = f"{v['tflops']:.3f}" if v["tflops"] is not None else "-"
        lines.append(f"  {stage:15s} {v['seconds']:10.4f} {v['gflop']:10.2f} {tflops:>8s}")
    lines += [
        f"  {'total (warm)':15s} {r['total_seconds']:10.4f} {r['gflop']:10.2f}",
        f"  cold pass {r['cold_seconds']:.4f} s; warm passes {', '.join(f'{t:.4f}' for t in r['warm_seconds'])} s "
        f"(medians above); nominal {r['nominal_gflop']:.1f} GFLOP (all nocc^2 pairs)",
        f"  peak host memory {r['memory']['peak_rss_mb']:.0f} MB"
        + (f", device {r['memory']['peak_device_mb']:.0f} MB" if "peak_device_mb" in r["memory"] else ""),
    ]
    if r.get("device_gemm_tflops"):
        fraction = r.get("pair_energies_fraction_of_gemm_rate")
        lines.append(f"  device GEMM rate {r['device_gemm_tflops']:.3f} TFLOPS (measured, {r['precision']})"
                     + (f"; pair energies reach {100 * fraction:.0f}% of it" if fraction else ""))
    lines += _model_lines(r, scale=1.0, unit="s")
    write_stdout("\n".join(lines))


def _model_lines(r, scale, unit):
    """The calibrated model per target (with its breakdown) and the old peak model."""
    if not r.get("modelled"):
        return []
    lines = ["  MODELLED Trainium time (a model, not a measurement; launch + host transfer + busiest engine):"]
    for target, m in r["modelled"].items():
        parts = ", ".join(f"{k} {v * scale:.3f}" for k, v in m["breakdown"].items() if k != "device")
        own = target == r.get("device")
        lines.append(f"    {target}: {m['seconds'] * scale:.3f} {unit} in {m['launches']} launches "
                     f"({parts} {unit}); Tensor Engine useful fraction "
                     f"{m['tensor_engine_useful_fraction']:.3f}"
                     + ("" if own else f" (from the {r.get('device')} trace)"))
        if m.get("hidden_upload_seconds"):
            lines.append(f"      uploads overlapped with the previous kernel (a runtime assumption, not in "
                         f"host_transfer): {m['hidden_upload_seconds'] * scale:.3f} {unit}")
        if own and m.get("by_kernel"):
            lines.append("      per kernel: " + ", ".join(
                f"{k} useful {v['tensor_engine_useful_fraction']:.2f}, {v['max_instructions_per_launch']:,} "
                f"instructions/launch, SBUF {v['peak_sbuf_bytes_per_partition'] / 1024:.0f} KiB" for k, v in sorted(m["by_kernel"].items())
                if v["tensor_engine_useful_fraction"] is not None))
    lines.append("  peak model (published peaks, no launch cost; old): " + ", ".join(
        f"{k} {v * scale:.3f} {unit}" for k, v in r["modelled_seconds"].items()))
    return lines


def print_kernel_bench(r):
    m = r["modelled"]
    parts = ", ".join(f"{k} {v * 1e3:.3f}" for k, v in m["breakdown"].items())
    lines = [
        f"dfmp2 bench --kernel {r['kernel']} --size {r['size']}: {r['shape']}, {r['device']}, nki {r['nki_api']}",
        f"  MODELLED warm time (a model, not a measurement): {m['seconds'] * 1e3:.3f} ms in "
        f"{r['launches']} launch(es)",
        f"  breakdown (ms): {parts}",
        "  (launch and host_transfer are serial; the engine times overlap, device = their maximum)",
    ]
    if m.get("tensor_engine_useful_fraction") is not None:
        lines.append(f"  Tensor Engine useful fraction {m['tensor_engine_useful_fraction']:.3f}")
    if "published_trn1_ms" in r:
        lines.append(f"  published trn1 measurement of a sibling library's kernel: {r['published_trn1_ms']} ms "
                     f"(model / measured = {r['model_over_published']:.2f})")
    write_stdout("\n".join(lines))


COMPONENT_LABELS = (("e_ref", "E(ref)"), ("e_corr_os", "E(corr, os)"), ("e_corr_ss", "E(corr, ss)"),
                    ("e_corr", "E(corr)"), ("e_scs", "E(corr, SCS)"), ("e_tot", "E(total)"),
                    ("e_tot_scs", "E(total, SCS)"))


def print_composite(r):
    """A counterpoise and/or extrapolated energy: each run's energies, the limit, E_int."""
    first = next(iter(next(iter(r["per_basis"].values()))["runs"].values()))
    lines = [f"dfmp2 {first['version']}: DF-MP2 (RI-MP2) {' and '.join(r['workflow'])}",
             f"  molecule    {r['molecule']}, {len(r['systems'])} system{'s' * (len(r['systems']) != 1)}, basis {r['basis']}",
             f"  device      {first['device']} ({first['device_description']}), {first['backend']} backend, "
             f"{first['precision']}; SCF {first['scf']}" + (f" (JK-fit: {first['scf_auxbasis']})"
                                                            if first['scf_auxbasis'] and len(r["bases"]) == 1 else ""),
             *[f"  note        {note}" for note in r.get("notes", [])],
             "", f"  {'basis':18s} {'system':26s} {'E(ref)':>18s} {'E(corr)':>16s} {'E(total)':>18s}"]
    for basis, block in r["per_basis"].items():
        for name, e in block["energies"].items():
            lines.append(f"  {basis:18s} {name:26s} {e['e_ref']:18.10f} {e['e_corr']:16.10f} {e['e_tot']:18.10f}")
    if "extrapolation" in r:
        scheme = r["extrapolation"]["scheme"]
        lines += ["", f"  basis-set limit (SCF: {scheme['scf']}; correlation: {scheme['corl']})"]
        for name, e in r["extrapolation"]["energies"].items():
            lines.append(f"  {'CBS':18s} {name:26s} {e['e_ref']:18.10f} {e['e_corr']:16.10f} {e['e_tot']:18.10f}")
    for kind, values in r.get("interaction", {}).items():
        kcal = r["interaction_kcal_mol"][kind]
        where = "CBS" if "extrapolation" in r else r["bases"][-1]
        lines += ["", f"  interaction energy, {kind.upper()} ({where})" + " " * 8 + f"{'Eh':>16s} {'kcal/mol':>12s}"]
        lines += [f"    {label:38s} {values[key]:16.10f} {kcal[key]:12.6f}" for key, label in COMPONENT_LABELS]
    write_stdout("\n".join(lines))


def print_batch_line(r):
    """One molecule of several: its name, formula and total energy, or why it failed."""
    if r["status"] != "ok":
        write_stdout(f"{r['molecule']}: failed (exit {r['exit_code']}): {r['error']}")
        return
    if "workflow" in r:
        kind = next(iter(r.get("interaction", {})), None)
        value = r["interaction"][kind]["e_tot"] if kind else r["energies"]["whole"]["e_tot"]
        label = f"E_int({kind.upper()})" if kind else "E(total)"
        write_stdout(f"{r['molecule']}: {' and '.join(r['workflow'])}  {label} {value:.10f} Eh")
        return
    seconds = sum(r["timings"].values())
    write_stdout(f"{r['molecule']}: {r['formula']}  E(total) {r['e_tot']:.10f} Eh  ({seconds:.2f} s in steps)")
