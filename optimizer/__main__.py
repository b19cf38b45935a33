"""``python -m kvtier``: the same command line as the ``kvtier`` script."""

from kvtier.cli import main

if __name__ == "__main__":
    main()
