"""The data path of ``run_with_data``: a DataFrame's rows to each rank's batches, one room.  [anywhere]

The steps, in the order the rows travel:

1. **driver, once a run** (:func:`.plan.plan` -> :class:`.plan.Data`, what
   :class:`~sparkml_dist.runner.run.Run` calls): each vector column's width, declared by Spark ML's
   stages or read from the first rows, and the columns as the ranks get them (vectors as arrays of
   doubles) (:mod:`.sharding`);
2. **driver, each attempt** (:meth:`.plan.Data.deal`, again after an elastic resize): a plain
   Parquet scan cut into ``S`` streams of its files' row ranges (:mod:`.parquet_split`); any other
   DataFrame written once as Parquet (:mod:`.staging`) and cut the same way; or, for the exact
   deal, the rows dealt through Spark as contiguous ranges of one order, in one shuffle
   (:mod:`.range_deal`). Which path gives which guarantee: docs/runner.md;
3. **task** (:mod:`.feeding`): the rows Spark brought spilled to the rank's local disk as Arrow
   IPC, or the Parquet slices named, in a small manifest for the rank;
4. **rank** (:mod:`.sources`): the manifest opened, a stream's chunks read from where they lie
   (the spill file, Parquet row ranges whose vector structs are checked as they are read:
   :mod:`sparkml_dist.vectors`);
5. **rank** (:mod:`.shard`): ``shard()``, whole (``to_numpy``, ``to_torch``) or streamed;
6. **rank** (:mod:`.loader`, :mod:`.sample_order`): batches in the global order, every row once an
   epoch, windows read ahead, a resumable position; (:mod:`.framework_data`) the same loader as
   Keras and TensorFlow input.

A new data path (a Delta table read in place, say) is a new way of step 2 and a new source of
step 4; nothing outside this room changes.
"""
