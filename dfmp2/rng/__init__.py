"""Counter-based random numbers (Philox4x32-10) for synthetic benchmark problems.

Nothing here yet: the generator arrives with `dfmp2 bench` (the synthetic-benchmarks issue).
The DF-MP2 energy of a molecule uses no random numbers.
"""
