"""The benchmark molecules that are not in examples/, written as XYZ files (Angstrom):
idealised geometries, good enough for timing (each converges in an ordinary number of SCF cycles).

    python benchmarks/molecules.py examples/     # water16.xyz, hexadecane.xyz, triacontane.xyz

  water16      (H2O)16: a 2 x 2 x 4 grid of waters 2.85 A apart, alternately oriented (384 functions in cc-pVDZ)
  hexadecane   C16H34, all-trans zig-zag, C-C 1.54 A, C-H 1.09 A (394 functions in cc-pVDZ)
  triacontane  C30H62, the same (730 functions in cc-pVDZ)
"""

from __future__ import annotations

import os
import sys


def alkane(n):
    """[(symbol, x, y, z)] of the all-trans alkane CnH(2n+2)."""
    atoms = []
    for k in range(n):
        x, up = 1.27 * k, 1 if k % 2 == 0 else -1
        y = 0.436 * up
        atoms.append(("C", x, y, 0.0))
        atoms += [("H", x, y + 0.63 * up, 0.89), ("H", x, y + 0.63 * up, -0.89)]
        if k in (0, n - 1):  # the methyl groups' third hydrogen, along the chain
            atoms.append(("H", x + (-1.03 if k == 0 else 1.03), y - 0.36 * up, 0.0))
    return atoms


def water_cluster(nx=2, ny=2, nz=4, spacing=2.85):
    """[(symbol, x, y, z)] of nx * ny * nz waters on a grid, each turned by 90 degrees from its neighbours."""
    atoms = []
    for i in range(nx):
        for j in range(ny):
            for k in range(nz):
                ox, oy, oz = spacing * i, spacing * j, spacing * k
                atoms.append(("O", ox, oy, oz))
                if (i + j + k) % 2 == 0:
                    atoms += [("H", ox + 0.757, oy + 0.586, oz), ("H", ox - 0.757, oy + 0.586, oz)]
                else:
                    atoms += [("H", ox, oy - 0.586, oz + 0.757), ("H", ox, oy - 0.586, oz - 0.757)]
    return atoms


MOLECULES = {"water16": (water_cluster, "(H2O)16"), "hexadecane": (lambda: alkane(16), "C16H34"),
             "triacontane": (lambda: alkane(30), "C30H62")}


def write_xyz(path, atoms, title):
    with open(path, "w", encoding="ascii") as handle:
        handle.write(f"{len(atoms)}\n{title}\n")
        handle.writelines(f"{s:2s} {x:12.6f} {y:12.6f} {z:12.6f}\n" for s, x, y, z in atoms)


def main(argv=None):
    directory = (argv or sys.argv[1:] or ["examples"])[0]
    for name, (make, title) in MOLECULES.items():
        write_xyz(os.path.join(directory, f"{name}.xyz"), make(), f"{title} (benchmarks/molecules.py)")


if __name__ == "__main__":
    main()
