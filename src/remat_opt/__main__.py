"""``python -m remat_opt`` (also installed as ``remat-opt``): see :mod:`remat_opt._cli`."""

import sys

from ._cli import main

if __name__ == "__main__":
    sys.exit(main())
