"""``python -m loaderx``: the loaderx command line (see ``loaderx.cli``)."""

import sys

from loaderx.cli import main

sys.exit(main())
