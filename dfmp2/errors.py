"""The two kinds of failure dfmp2 reports.

InputError: the user asked for something impossible (exit status 2).
ComputationError: valid input, but the run failed (exit status 1).
Messages are one line and name the problem.
"""


class DFMP2Error(Exception):
    """Base class; ``exit_code`` is what the CLI exits with."""

    exit_code = 1


class InputError(DFMP2Error, ValueError):
    """Bad input: file, molecule, basis, option values, memory budget."""

    exit_code = 2


class ComputationError(DFMP2Error, RuntimeError):
    """A runtime failure: SCF not converging, device error, numerical breakdown."""

    exit_code = 1
