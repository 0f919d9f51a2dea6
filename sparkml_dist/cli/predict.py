"""``sparkml-dist predict``: score a file of rows with a saved model, across the cluster.  [driver]

    sparkml-dist predict --model out/model --input new.parquet --output scored.parquet
    sparkml-dist predict --model out/net --builder mypkg.nets:make_net --input-cols features \\
        --input new.parquet --output scored.parquet

``--model`` is a saved ensemble or grouped model (its own ``transform`` scores the rows) or a
network saved with :mod:`sparkml_dist.formats.networks`, which needs ``--builder`` (the function that
builds the untrained network: named here by the user, never taken from the files) and
``--input-cols``; its output is ``--return-type`` (default ``array<float>``).  The input is Parquet
or CSV (``--format``); the output is written as Parquet, every input column plus the predictions
(an ensemble's probabilities as arrays of doubles; ``--keep-vectors`` keeps Spark ML vectors).
"""

from __future__ import annotations

import argparse
import os

from ..errors import ConfigurationError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="a saved ensemble/grouped model or torch_models directory")
    p.add_argument("--input", required=True, help="rows to score (Parquet or CSV)")
    p.add_argument("--output", required=True, help="where the scored rows go (Parquet)")
    p.add_argument("--format", choices=("parquet", "csv"), default="parquet", help="the input's format")
    p.add_argument("--builder", default=None, help="module:function building the network (networks only)")
    p.add_argument("--input-cols", default=None, help="comma list of the network's input columns")
    p.add_argument("--return-type", default="array<float>", help="the network output's Spark type")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--overwrite", action="store_true", help="replace --output if it exists")
    p.add_argument(
        "--keep-vectors",
        action="store_true",
        help="write an ensemble's probability/rawPrediction as Spark ML vectors (default: arrays)",
    )


def read_input(spark, spec: dict):
    """A job's input table: ``{path, format}`` (CSV with a header, types inferred; else Parquet)."""
    fmt = spec.get("format") or ("csv" if str(spec["path"]).endswith(".csv") else "parquet")
    reader = spark.read
    if fmt == "csv":
        reader = reader.option("header", True).option("inferSchema", True)
    return reader.format(fmt).load(spec["path"])


class _NetworkPredictor:
    """make_predict_fn of a saved network: loaded once per Python worker by the named builder."""

    def __init__(self, path: str, builder: str) -> None:
        self.path, self.builder = path, builder

    def __call__(self):
        import numpy as np
        import torch

        from ..formats import networks as torch_models

        net = torch_models.load(self.path, self.builder)

        def predict(*arrays):
            parts = [a if a.ndim == 2 else a[:, None] for a in arrays]
            x = torch.from_numpy(np.concatenate(parts, axis=1).astype(np.float32, copy=False))
            with torch.no_grad():
                return net(x).numpy()

        return predict


def check_arguments(args) -> None:
    """What can be checked before a Spark session starts: the model and input exist (local paths),
    and a saved network comes with ``--builder`` and ``--input-cols``."""
    from ..formats import networks as torch_models

    for option, where in (("--model", args.model), ("--input", args.input)):
        if "://" not in where and not os.path.exists(where):
            raise ConfigurationError(f"{option} {where} does not exist")
    model_dir = os.path.abspath(args.model) if "://" not in args.model else args.model
    if os.path.exists(os.path.join(model_dir, torch_models.META)):
        if not args.builder or not args.input_cols:
            raise ConfigurationError(
                f"{args.model} is a saved network: give --builder module:function (what builds it) "
                "and --input-cols (the columns it reads)"
            )
        torch_models.builder_name(args.builder)


def run(spark, args) -> dict:
    from ..formats import networks as torch_models
    from ..inference import predict_batch

    df = read_input(spark, {"path": args.input, "format": args.format})
    model_dir = os.path.abspath(args.model) if "://" not in args.model else args.model
    check_arguments(args)
    if os.path.exists(os.path.join(model_dir, torch_models.META)):
        scored = predict_batch(
            df,
            _NetworkPredictor(model_dir, args.builder),
            input_cols=[c for c in args.input_cols.split(",") if c],
            return_type=args.return_type,
            batch_size=args.batch_size,
        )
        kind = "network"
    else:
        from ..ensemble.stored.persistence import load_stage

        model = load_stage(model_dir)
        scored, kind = model.transform(df), type(model).__name__
        if not getattr(args, "keep_vectors", False):  # arrays: any Parquet reader understands them
            from pyspark.ml.functions import vector_to_array

            vectors = [f.name for f in scored.schema.fields if f.dataType.simpleString() == "vector"]
            scored = scored.withColumns({c: vector_to_array(c) for c in vectors})
    scored.write.mode("overwrite" if args.overwrite else "errorifexists").parquet(args.output)
    rows = spark.read.parquet(args.output).count()
    return {"model": args.model, "kind": kind, "rows": rows, "output": args.output}
