"""The two kinds of failure dfmp2 reports, and their kinds.

InputError: the user asked for something impossible (exit status 2).
MemoryBudgetError: an InputError that is also a MemoryError: the budget cannot hold the run
(PySCF code catches MemoryError).
ComputationError: valid input, but the run failed (exit status 1).
ConvergenceError: a ComputationError of an iteration that did not converge (the SCF, an optimisation).
DeviceUnavailableError: a ComputationError of a device dfmp2 knows that this machine cannot run
(no usable CUDA GPU, no Neuron SDK, no NCCL for a team on GPUs): nothing was computed.
Messages are one line and name the problem. QCSchema's error types of each: api.qcschema.ERROR_TYPES.
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


class ConvergenceError(ComputationError):
    """An iteration (the SCF, a geometry optimisation) that did not converge in the cycles it was given."""


class DeviceUnavailableError(ComputationError):
    """A device dfmp2 knows that this machine cannot run (another machine can): nothing was computed."""


class MemoryBudgetError(InputError, MemoryError):
    """The memory budget (--max-memory, max_memory) cannot hold the run: bad input (exit 2),
    and a MemoryError, which PySCF scripts catch to retry with smaller settings."""


# ----------------------------------------------------------------------------- naming a setting

_UNSET = object()
_COMMAND_LINE = [False]  # True while the command line runs: messages name its options


def option(name: str, value=_UNSET) -> str:
    """How the user wrote the setting `name` (a `Settings` field, or another keyword such as
    max_steps), for a message: `--max-memory` on the command line, `max_memory` from Python;
    with a value, `--device cuda` / `device='cuda'`. One spelling per interface, so that a
    script is never told to pass a command-line flag, nor a shell user a keyword."""
    if _COMMAND_LINE[0]:
        flag = "--" + name.replace("_", "-")
        return flag if value is _UNSET else f"{flag} {value}"
    return name if value is _UNSET else f"{name}={value!r}"


class command_line_names:
    """Within this context, `option` spells settings as command-line options (the CLI's commands
    run inside it; the previous spelling is restored on exit)."""

    def __enter__(self):
        self._previous = _COMMAND_LINE[0]
        _COMMAND_LINE[0] = True
        return self

    def __exit__(self, *exc):
        _COMMAND_LINE[0] = self._previous
        return False
