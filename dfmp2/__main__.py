"""`python -m dfmp2 ...` (and `torchrun ... -m dfmp2 run ...`): the command line."""

from .app.entry import main

main()
