"""`python -m planner ...` is `plan ...`."""

import sys

from planner.cli import main

sys.exit(main())
