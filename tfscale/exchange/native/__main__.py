"""``python -m tfscale.exchange.native``: builds the exchange's op now and prints its path."""

import sys

from tfscale.exchange.native import main

sys.exit(main())
