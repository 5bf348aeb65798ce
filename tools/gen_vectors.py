"""Regenerate tests/vectors/kvsp-v1.json (thin wrapper around ``kvcs.kv.vectors``)."""

import sys

from kvcs.kv.vectors import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
