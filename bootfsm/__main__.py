"""`python -m bootfsm` runs the CLI."""

import sys

from bootfsm.cli import main

sys.exit(main())
