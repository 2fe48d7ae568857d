"""``python -m nmtkit.datasets``: the launcher of :mod:`nmtkit.cli.datasets`."""

from nmtkit.cli.datasets import main

if __name__ == "__main__":
    main()
