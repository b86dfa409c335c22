"""The side-by-side serving benchmark: this project against the in-process limit, the Triton floor
and Merlin Systems, on the session-based example. Run it with ``./run bench``.
"""

import os

# Servers measured here run their steps as exported, one instance each, like the systems they are
# compared with: failover's second instances and standbys would load while the clock runs and
# change what "one server" holds (MTS_FAILOVER=1 measures with them).
os.environ.setdefault("MTS_FAILOVER", "0")
