"""dfmp2 as an ASE calculator (needs ase: pip install 'dfmp2[workflows]'):

    from dfmp2.ase import DFMP2Calculator
    atoms.calc = DFMP2Calculator(basis="cc-pvdz", frozen_core=True)
    atoms.get_potential_energy(), atoms.get_forces()   # eV, eV/Angstrom

The class lives in dfmp2/api/ase_calculator.py.
"""

from .api.ase_calculator import DFMP2Calculator

__all__ = ["DFMP2Calculator"]
