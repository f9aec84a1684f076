"""``python -m replaystore.cli``: the ``replaystore`` command."""

import sys

from replaystore.cli.main import main

sys.exit(main())
