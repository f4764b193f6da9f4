"""``python -m bridge`` is the ``nats-bridge`` command."""

import sys

from bridge.cli import main

sys.exit(main())
