"""`python -m tula.cli`: the `tula` command."""

import sys

from tula.cli import main

sys.exit(main())
