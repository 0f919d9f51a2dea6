"""Scoring with the fitted models: bagging members' votes, each key's own model, out-of-bag.  [anywhere]

:mod:`.members` (members voting and averaging over Arrow batches), :mod:`.keys` (each row by its
key's model) and :mod:`.oob` (each row scored by the members that did not see it).
"""
