"""Write policies: which newly computed blocks are copied into the tiers below HBM, one module
each.

A write-policy module holds its two twins side by side:

* ``chosen(lower, blocks) -> list[int]``: the reference step, over the reference engine's
  :class:`~kvtier.sim.reference_tiers.LowerTiers` (its ``sightings`` and ``cfg``), the blocks of
  ``blocks`` an iteration computed that are copied down at its end;
* ``chosen_nb(ts, tp, buf, nbuf) -> int``: its numba twin, which keeps the chosen blocks at the
  front of ``buf[:nbuf]`` in order and returns their count, reached through the dispatch
  ``python -m kvtier.sim.gen`` writes from the registry (:mod:`.dispatch`).

Its traits, in :data:`kvtier.policy.registries.WRITE_POLICIES`, say what the tier engines do
around it: ``cascade`` (a block a tier evicts is copied into the next tier down, and so is a
block HBM evicts) and ``sightings`` (admissions count each block's sightings; an HBM hit that
reaches ``selective_k`` sightings is copied down then).
"""
