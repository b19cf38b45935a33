"""Load rules: how many of the prefix blocks found below HBM a request loads (the rest it
recomputes), one module each.

A load-rule module holds its two twins side by side:

* ``choose(lower, inst, now, src, hbm_hits, B) -> int``: the reference step, over the reference
  engine's :class:`~kvtier.sim.reference_tiers.LowerTiers` (``src``: the source tier of each
  found block, in prompt order, after ``hbm_hits`` HBM hits);
* ``choose_nb(sim, k, now, n_src, hbm_hits, timing) -> int``: its numba twin over the
  engine's state (:class:`kvtier.sim.nb_state.Sim`: the ``n_src`` found blocks' source tiers in
  ``sim.buf.src``, a scratch array of one entry per tier in ``sim.buf.counts``), ``timing``
  the instance's packed step times, reached through the dispatch ``python -m kvtier.sim.gen``
  writes from the registry (:mod:`.dispatch`).
"""
