"""``python -m gateway``: the same entry point as the ``consumer-gateway`` console script."""

import sys

from gateway.main import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
