"""`python -m ipybox.cli`: the `ipybox` command."""

import sys

from ipybox.cli.main import main

sys.exit(main())
