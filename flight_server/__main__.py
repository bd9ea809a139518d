"""``python -m flight_server``."""

import sys

from flight_server.memory import cap_malloc_arenas

# Before the server's threads exist: an arena is given to a thread when it
# first allocates.
cap_malloc_arenas()

from flight_server.cli import main  # noqa: E402

sys.exit(main())
