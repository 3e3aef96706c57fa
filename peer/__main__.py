"""``python -m peer`` is ``peerd``."""

import sys

from .cli import peerd_main

sys.exit(peerd_main())
