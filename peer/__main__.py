"""``python -m peer`` is ``peerd``."""

import sys

from peer.cli.main import peerd_main

sys.exit(peerd_main())
