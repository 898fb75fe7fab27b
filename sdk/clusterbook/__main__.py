"""``python -m clusterbook``: the ``clusterbook`` command."""

import sys

from clusterbook.cli.main import main

sys.exit(main())
