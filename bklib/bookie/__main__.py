"""``python -m bklib.bookie``: run a Python bookie (see bklib.bookie.main)."""

import sys

from bklib.bookie.main import main

sys.exit(main())
