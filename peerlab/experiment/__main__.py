"""``python -m peerlab.experiment``: the same as ``peerctl experiment``."""

import argparse
import sys

from . import add_arguments, run

parser = argparse.ArgumentParser(prog="python -m peerlab.experiment")
add_arguments(parser)
sys.exit(run(parser.parse_args()))
