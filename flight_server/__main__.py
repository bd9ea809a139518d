"""``python -m flight_server``."""

import sys

from flight_server.cli import main

sys.exit(main())
