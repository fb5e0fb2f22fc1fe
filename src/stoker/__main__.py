"""``python -m stoker`` runs the ``stoker`` command."""

import sys

from stoker.cli import main

sys.exit(main())
