"""``python -m dataset_rt``."""

import sys

from dataset_rt.cli import main

sys.exit(main())
