"""`python -m engine.benchmarks.peers` = `infersight bench peers`."""

import argparse
import sys

from engine.benchmarks.peers.cli import add_arguments, run

parser = argparse.ArgumentParser(prog="infersight bench peers", description=__doc__)
add_arguments(parser)
sys.exit(run(parser.parse_args()))
