"""``python -m chaos``: see chaos/README.md."""

import sys

from chaos.cli import main

sys.exit(main())
