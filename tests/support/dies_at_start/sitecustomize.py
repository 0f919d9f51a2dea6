"""Put on PYTHONPATH by a test: rank 1's process of a run (and nothing else) dies as it starts,
before reading its start message, as one killed by the OOM killer or a broken environment would.
It closes its stdin first and lingers a moment, so the start message always meets a closed pipe."""

import os
import time

if os.environ.get("SPARKML_DIST_RUN_ID") and os.environ.get("RANK") == "1":
    os.close(0)
    print("rank 1 cannot start: injected", flush=True)
    time.sleep(2)
    os._exit(7)
