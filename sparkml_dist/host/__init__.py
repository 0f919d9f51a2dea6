"""This machine, as a run sees it: its address toward the peers, and its processes.  [anywhere]

:mod:`.network` finds the address other ranks reach this host at (and the interface holding it);
:mod:`.processes` finds a process and everything it started, and ends them together.
"""
