"""Which steps a batch uses and how they become a ``Batch``: uniform and prioritized draws, the sum
tree, assembly of stacks and n-step returns, the RAM estimate, and ``ReplayStore``'s sampling
methods."""
