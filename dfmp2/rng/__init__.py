"""Counter-based random numbers: Philox4x32-10 (Salmon et al., SC'11; Random123), the same words on
every device.

    philox.py       the host generator (numpy; torch on a GPU): philox4x32, random_words, uniform, normal
    nki_philox.py   the NeuronCore generator (an NKI kernel in 8-bit limbs, every intermediate below
                    2^24): its words equal random_words' bit for bit
    device.py       nki_random_words: that kernel launched through an NKI backend's launcher
    synthetic.py    the synthetic benchmark problems (`dfmp2 bench`) drawn from these streams

A stream: counter = (block mod 2^32, block div 2^32, stream, 0), key = (seed mod 2^32, seed div 2^32);
element e of a stream of 32-bit words lies in block e // 4, word e % 4.
"""

from __future__ import annotations

from .device import nki_philox_file, nki_random_words  # noqa: F401
from .philox import normal, philox4x32, random_words, stream_key, uniform  # noqa: F401
