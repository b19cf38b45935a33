"""Load rules: how many of the prefix blocks found below HBM a request loads (the rest it
recomputes), one module each.

A load-rule module holds its two twins side by side:

* ``choose(lower, inst, now, src, hbm_hits, B) -> int``: the reference step, over the reference
  engine's :class:`~kvtier.sim.reference_tiers.LowerTiers` (``src``: the source tier of each
  found block, in prompt order, after ``hbm_hits`` HBM hits);
* ``choose_nb(tp, lk, k, now, src, n_src, hbm_hits, B, counts, timing, path) -> int``: its numba
  twin (``counts`` a scratch array of one entry per tier, ``timing`` the instance's packed step
  times), reached through the dispatch ``python -m kvtier.sim.gen`` writes from the registry
  (:mod:`.dispatch`).
"""
