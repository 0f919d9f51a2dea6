"""What an ensemble stores: members and key models, in blocks, in tables, in a saved model.  [anywhere]

:mod:`.member_store` (members written by the executors to a model store), :mod:`.key_blocks` and
:mod:`.key_models` (many keys' models in blocks, held as references), :mod:`.members_table`
(models as rows of a Spark table, and back) and :mod:`.persistence` (pyspark.ml save and load of
every stage).  The member format itself is :mod:`sparkml_dist.ensemble.member_records`.
"""
