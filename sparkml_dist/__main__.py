"""``python -m sparkml_dist``: the same as the ``sparkml-dist`` command.  [driver]"""

import sys

from sparkml_dist.cli import main

sys.exit(main())
