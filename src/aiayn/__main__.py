"""``python -m aiayn ...``: the ``aiayn`` command, as torchrun launches it (``torchrun ... -m aiayn train ...``)."""

import sys

from aiayn.cli.main import main

sys.exit(main())
