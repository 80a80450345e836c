"""`python -m epd ...` runs the same CLI as the `epd` script."""

import sys

from epd.cli import main

sys.exit(main())
