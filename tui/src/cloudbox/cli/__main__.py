"""`python -m cloudbox.cli`: the same entry point as the `cloudbox` console script."""

import sys

from cloudbox.cli import main

sys.exit(main())
