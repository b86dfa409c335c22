"""``python -m merlin_torch_serving``: the same as the ``merlin-torch-serving`` command."""

import sys

from merlin_torch_serving.cli import main

sys.exit(main())
