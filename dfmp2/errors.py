"""The two kinds of failure dfmp2 reports.

InputError: the user asked for something impossible (exit status 2).
MemoryBudgetError: an InputError that is also a MemoryError: the budget cannot hold the run
(PySCF code catches MemoryError).
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


class MemoryBudgetError(InputError, MemoryError):
    """The memory budget (--max-memory, max_memory) cannot hold the run: bad input (exit 2),
    and a MemoryError, which PySCF scripts catch to retry with smaller settings."""
