"""``python tests/fakeserver ...`` (as benchmarks run it) or ``python -m fakeserver ...``."""

import sys
from pathlib import Path

if __package__ in (None, ""):
    # Run as a directory: Python put this package's own folder first on the path, where its
    # modules (``anthropic``, ``modes``) would shadow real packages; import it from tests/.
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    sys.path.insert(0, str(here.parent))

from fakeserver.cli import main

main()
