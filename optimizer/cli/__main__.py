"""``python -m kvtier.cli``: the same command line as the ``kvtier`` script (worker processes
are started this way, e.g. by the study-storage tests)."""

from kvtier.cli import main

if __name__ == "__main__":  # pragma: no cover
    main()
