"""``python -m kvcs``: the kvcs command line (see :mod:`kvcs.cli`)."""

from kvcs.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
