"""``python -m idist`` and the ``idist`` console script: see ``idist._cli``."""

from __future__ import annotations

import sys


def main() -> int:
    from ._cli import main as cli  # deferred: this module is the console script's entry point

    return cli(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
