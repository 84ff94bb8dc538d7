"""Bit-level fingerprint of dfmp2's energies on a fixed set of runs, to show that a restructuring
changed no arithmetic (issue 23: "energies bit-identical before and after").

    python tools/energy_fingerprint.py --out before.json        # on the old commit
    python tools/energy_fingerprint.py --compare before.json     # on the new one: exit 1 on any difference

Each run is `dfmp2 run` as a user types it (the CLI in a subprocess; two ranks under torchrun):
RHF, UHF, ROHF, a double hybrid, natural occupations, two ranks, a checkpoint resumed, and the
NKI kernels emulated for trn1 and trn2; the out-of-core run is the plugin with force_outcore=True
(in a subprocess too).
Every energy (and natural occupation) is recorded as float.hex, so equal means bit-identical.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

WATER = "3\n\nO 0 0 0.1173\nH 0 0.7572 -0.4692\nH 0 -0.7572 -0.4692\n"
OH = "2\n\nO 0 0 0\nH 0 0 0.97\n"
NH2 = "3\n\nN 0 0 0.14\nH 0 0.80 -0.49\nH 0 -0.80 -0.49\n"

RUNS = {  # name -> (molecule, extra arguments)
    "rhf": (WATER, ["--basis", "cc-pvdz"]),
    "uhf": (OH, ["--basis", "cc-pvdz", "--spin", "1"]),
    "rohf": (NH2, ["--basis", "cc-pvdz", "--spin", "1", "--reference", "rohf", "--frozen-core"]),
    "double_hybrid": (WATER, ["--basis", "cc-pvdz", "--xc", "b2plyp"]),
    "natorbs": (WATER, ["--basis", "cc-pvdz", "--natorbs", "{tmp}/n.molden"]),
    "out_of_core": (WATER, []),  # the plugin, force_outcore=True (OUT_OF_CORE)
    "two_ranks": (WATER, ["--basis", "cc-pvdz"]),
    "checkpoint_resumed": (WATER, ["--basis", "cc-pvdz", "--checkpoint", "{tmp}/ck"]),
    "trn1_emulated": (WATER, ["--basis", "cc-pvdz", "--device", "trn1", "--simulate"]),
    "trn2_emulated": (WATER, ["--basis", "cc-pvdz", "--device", "trn2", "--simulate"]),
}
OUT_OF_CORE = """
import json, sys
from pyscf import gto, scf
from dfmp2 import DFMP2
mol = gto.M(atom=sys.argv[1], basis="cc-pvdz", verbose=0)
mf = scf.RHF(mol).density_fit().run(conv_tol=1e-11, conv_tol_grad=1e-7)
pt = DFMP2(mf, auxbasis="cc-pvdz-ri").set(force_outcore=True)
pt.kernel(with_t2=False)
json.dump(pt.result.as_dict(), open(sys.argv[2], "w"))
"""
ENERGIES = ("e_ref", "e_corr", "e_corr_os", "e_corr_ss", "e_corr_singles", "e_tot")


def run(name, molecule, extra, tmp):
    """The JSON record of one `dfmp2 run` (twice for the resumed checkpoint: the second's)."""
    xyz = os.path.join(tmp, f"{name}.xyz")
    with open(xyz, "w") as handle:
        handle.write(molecule)
    out = os.path.join(tmp, f"{name}.json")
    args = [a.format(tmp=tmp) for a in extra]
    command = [sys.executable, "-m", "dfmp2", "run", xyz, *args, "--json", out, "--quiet"]
    if name == "out_of_core":
        command = [sys.executable, "-c", OUT_OF_CORE, xyz, out]
    if name == "two_ranks":
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                   "-m", "dfmp2", "run", xyz, *args, "--json", out, "--quiet"]
    for _ in range(2 if name == "checkpoint_resumed" else 1):
        proc = subprocess.run(command, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{name}: dfmp2 run failed ({proc.returncode}): {proc.stderr.strip()[-400:]}")
    with open(out) as handle:
        return json.load(handle)


def fingerprint() -> dict:
    prints = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (molecule, extra) in RUNS.items():
            record = run(name, molecule, extra, tmp)
            entry = {key: float(record[key]).hex() for key in ENERGIES if record.get(key) is not None}
            if name == "natorbs":
                entry["natural_occupations"] = [float(x).hex() for x in record["natorbs"]["occupations"]]
            entry["storage"] = record["memory"]["storage"]
            if name == "checkpoint_resumed":
                entry["reused_pair_tasks"] = record["checkpoint"]["reused_pair_tasks"]
            prints[name] = entry
            print(f"{name:20s} e_corr {record['e_corr']:.12f}  ({entry['storage']})", flush=True)
    return prints


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write the fingerprint here")
    parser.add_argument("--compare", help="a fingerprint to compare with (exit 1 on any difference)")
    args = parser.parse_args(argv)
    prints = fingerprint()
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(prints, handle, indent=1)
    if args.compare:
        with open(args.compare) as handle:
            before = json.load(handle)
        differing = [f"{name}.{key}" for name in sorted(set(before) | set(prints))
                     for key in sorted(set(before.get(name, {})) | set(prints.get(name, {})))
                     if before.get(name, {}).get(key) != prints.get(name, {}).get(key)]
        print("bit-identical" if not differing else "DIFFERENT: " + ", ".join(differing))
        return 1 if differing else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
