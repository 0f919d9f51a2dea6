"""A user's script: a local Spark session, then a run whose rank 1 raises."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import user_train  # noqa: E402

from sparkml_dist import serialization  # noqa: E402
from sparkml_dist.runner import BarrierRunner  # noqa: E402
from sparkml_dist.session import get_session  # noqa: E402

serialization.ship_by_value(user_train)  # as a notebook's function travels: by value
spark = get_session("local[2]", conf_file=sys.argv[1])
BarrierRunner(2, spark=spark).run(user_train.train)
