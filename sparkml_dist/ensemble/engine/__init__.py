"""The per-group engine every per-group trainer runs on: plan the groups, fit them in the tasks.  [driver]

On the driver, :mod:`.groups` turns rows into groups (the shared split, or one group a key counted
by :mod:`.key_counts`, a key too big to hold planned to stream by :mod:`.streamed_keys`) and fits
them all in one job; in the tasks, :mod:`.task` takes each group's rows and :mod:`.fitting` fits it
(held, or from a stream: :mod:`.stream`; bounded in time: :mod:`.key_watch`).  What a fit makes
is stored by the ``stored`` room; the stages above (bagging, grouped, per group) call this one.
"""
