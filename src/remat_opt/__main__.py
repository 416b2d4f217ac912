"""``python -m remat_opt demo`` (also installed as ``remat-opt demo``)."""

import sys

from ._demo import main

if __name__ == "__main__":
    sys.exit(main())
