"""What runs on the executors for a run: the barrier task and the rank processes it starts.  [executor]

In the order they act: :mod:`.task` (one barrier task: its ranks started first, the shard fed,
the gang's addresses exchanged, the ranks watched; :mod:`.gangs` is the gang as a task sees it,
Spark's barrier or threads for local processes; :mod:`.workdirs` where a rank runs);
:mod:`.rank_process` (the task's handle on one rank process: its output, control events, exit);
:mod:`.rank` (the rank process itself: the backend prepared and joined, the function called, the
result written); :mod:`.stall_watch` (inside the rank: where is it when it stops moving; whether
it joined the rendezvous is its backend's to see, :mod:`sparkml_dist.runner.backends.store_watch`);
:mod:`.keeper`, :mod:`.warm_pool` and :mod:`.pool_server` (who starts a rank: a cold rank's keeper
or a warm pool, asked the same way, :mod:`.rank_request`). Every name and message they exchange
is in :mod:`sparkml_dist.runner.protocol`.
"""
