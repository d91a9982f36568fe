"""``python -m attngeom``: the command line, also under ``torchrun`` and ``accelerate
launch`` (``torchrun --nproc-per-node 2 -m attngeom analyze ...``)."""

import sys

from attngeom.cli import main

if __name__ == "__main__":
    sys.exit(main())
