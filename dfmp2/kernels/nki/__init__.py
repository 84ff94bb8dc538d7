"""The NKI backend (trn1, trn2, trn3): NkiBackend (backend.py), its kernels (kernels.py) and their launcher,
ledger, support checks, sparse layouts, exact-product slicing and tile sizes, run on AWS's Neuron SDK or,
with --simulate, on the NKI emulator (the nki_emulator package beside dfmp2).

The emulator reads no environment: importing this package points it at the Neuron settings of dfmp2's
environment (NEURON_SETTINGS, through util.environment), asked each time the emulator uses one, as the
Neuron SDK reads them from its process's environment.
"""

import nki_emulator

from ...util import environment

# the Neuron SDK's settings the emulator follows (nki_emulator.SETTINGS), read from the process's environment
NEURON_SETTINGS = ("NEURON_PLATFORM_TARGET_OVERRIDE", "NEURON_LOGICAL_NC_CONFIG", "NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE")


def neuron_setting(name: str, default=None):
    """The environment's value of the Neuron setting `name` (one of NEURON_SETTINGS) as a str, else `default`."""
    if name not in NEURON_SETTINGS:
        raise KeyError(f"{name} is not one of the Neuron settings dfmp2 hands the emulator ({NEURON_SETTINGS})")
    return environment.get(name, default)


nki_emulator.follow_settings(neuron_setting)
