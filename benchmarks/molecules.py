"""The benchmark molecules that are not in examples/, written as XYZ files (Angstrom):
idealised geometries, good enough for timing (each converges in an ordinary number of SCF cycles).

    python benchmarks/molecules.py examples/     # water16.xyz, hexane.xyz, hexadecane.xyz, hexacosane.xyz, ...

  water16      (H2O)16: a 2 x 2 x 4 grid of waters 2.85 A apart, alternately oriented (384 functions in cc-pVDZ)
  water32      (H2O)32: a 2 x 4 x 4 grid, the same (768 functions in cc-pVDZ)
  hexane       C6H14, all-trans zig-zag as below (154 functions in cc-pVDZ; the 20-atom optimisation test)
  hexadecane   C16H34, all-trans zig-zag, C-C 1.54 A, C-H 1.09 A (394 functions in cc-pVDZ)
  hexacosane   C26H54, the same (634 functions in cc-pVDZ)
  triacontane  C30H62, the same (730 functions in cc-pVDZ)
  coronene     C24H12, planar, seven fused rings, C-C 1.42 A, C-H 1.09 A (888 functions in cc-pVTZ)
  ovalene      C32H14, the same, ten rings (1,156 functions in cc-pVTZ)
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


def benzenoid(rings, cc=1.42, ch=1.09):
    """[(symbol, x, y, z)] of the planar benzenoid hydrocarbon whose hexagons are centred at
    i u + j v for (i, j) in rings (u, v: the honeycomb's centre lattice): its carbons, and a hydrogen
    on every carbon with two carbon neighbours, pointing outwards."""
    import math
    u = (1.5 * cc, math.sqrt(3) / 2 * cc)  # the centre of the hexagon across an edge, at 30 degrees
    v = (0.0, math.sqrt(3) * cc)  # at 90 degrees
    carbons = []
    for i, j in rings:
        cx, cy = i * u[0] + j * v[0], i * u[1] + j * v[1]
        for k in range(6):
            x, y = cx + cc * math.cos(math.radians(60 * k)), cy + cc * math.sin(math.radians(60 * k))
            if all((x - p) ** 2 + (y - q) ** 2 > 0.01 for p, q in carbons):
                carbons.append((x, y))
    atoms = [("C", x, y, 0.0) for x, y in carbons]
    for x, y in carbons:
        neighbours = [(p, q) for p, q in carbons if 0.01 < (x - p) ** 2 + (y - q) ** 2 < (1.1 * cc) ** 2]
        if len(neighbours) == 2:  # an edge carbon: H along the bisector, away from its neighbours
            dx = 2 * x - neighbours[0][0] - neighbours[1][0]
            dy = 2 * y - neighbours[0][1] - neighbours[1][1]
            norm = math.hypot(dx, dy)
            atoms.append(("H", x + ch * dx / norm, y + ch * dy / norm, 0.0))
    return atoms


CORONENE = [(0, 0), (1, 0), (-1, 0), (0, 1), (0, -1), (1, -1), (-1, 1)]  # a hexagon and its six neighbours
OVALENE = [(-1, 0), (-1, 1), (-1, 2), (0, -1), (0, 0), (0, 1), (0, 2), (1, -1), (1, 0), (1, 1)]  # rows of 3, 4, 3


MOLECULES = {"water16": (water_cluster, "(H2O)16"), "water32": (lambda: water_cluster(2, 4, 4), "(H2O)32"),
             "hexane": (lambda: alkane(6), "C6H14"),
             "hexadecane": (lambda: alkane(16), "C16H34"), "heptadecane": (lambda: alkane(17), "C17H36"),
             "hexacosane": (lambda: alkane(26), "C26H54"),
             "triacontane": (lambda: alkane(30), "C30H62"), "coronene": (lambda: benzenoid(CORONENE), "C24H12"),
             "ovalene": (lambda: benzenoid(OVALENE), "C32H14")}


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
