"""``python -m clusterbook``: the ``clusterbook`` command."""

import sys

from clusterbook.cli import main

sys.exit(main())
