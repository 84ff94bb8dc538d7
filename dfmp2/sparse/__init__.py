"""Block-sparse three-center tensors for screened integrals.

Nothing here yet: the molecular pipeline uses dense (mn|P) blocks.
"""
