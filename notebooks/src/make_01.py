"""Writes notebooks/01_ensembles.ipynb (kept as code so reviews see plain diffs)."""

from nbwrite import write

cells = [
    (
        "md",
        "# Bagged ensembles on Spark with `sparkml_dist`\n\nTrain one scikit-learn model per group "
        "of rows inside the Spark executors, let them vote, evaluate, save and load. Data: "
        "scikit-learn's breast-cancer set, as a Spark DataFrame.",
    ),
    (
        "code",
        "import os, sys\nos.environ.setdefault('PYSPARK_PYTHON', sys.executable)\n"
        "from pyspark.sql import SparkSession\n"
        "spark = (SparkSession.builder.master('local[2]').appName('01_ensembles')\n"
        "         .config('spark.ui.enabled', 'false').config('spark.sql.shuffle.partitions', '4')\n"
        "         .getOrCreate())\n"
        "print('Spark', spark.version, 'on', spark.sparkContext.master)",
    ),
    (
        "code",
        "import pandas as pd\nfrom sklearn.datasets import load_breast_cancer\n"
        "data = load_breast_cancer(as_frame=True)\n"
        "pdf = data.frame.rename(columns=lambda c: c.replace(' ', '_'))\n"
        "pdf['label'] = pdf.pop('target').astype(float)\n"
        "df = spark.createDataFrame(pdf)\n"
        "train, test = df.randomSplit([0.75, 0.25], seed=3)\n"
        "feature_cols = [c for c in df.columns if c != 'label']\n"
        "print(train.count(), 'training rows,', len(feature_cols), 'features')",
    ),
    (
        "md",
        "## Fit\n16 decision trees, each on a bootstrap sample (Poisson(0.6) copies of every row) and "
        "80% of the columns. `featuresCols` takes plain numeric columns; a vector column works too.",
    ),
    (
        "code",
        "from sklearn.tree import DecisionTreeClassifier\n"
        "from sparkml_dist.ensemble import BaggingClassifier\n"
        "bag = BaggingClassifier(estimator=DecisionTreeClassifier(max_depth=6), numModels=16,\n"
        "                        sampling='bootstrap', sampleRatio=0.6, featureRatio=0.8,\n"
        "                        featuresCols=feature_cols, labelCol='label', seed=7)\n"
        "model = bag.fit(train)\n"
        "print(len(model.models), 'members; rows per member:', model.groupSizes)\n"
        "print('member 0 uses columns', model.models[0].features)",
    ),
    (
        "md",
        "## Evaluate\n`transform` adds `prediction`, `probability` and `rawPrediction`, so Spark's "
        "evaluators work unchanged.",
    ),
    (
        "code",
        "from pyspark.ml.evaluation import BinaryClassificationEvaluator, MulticlassClassificationEvaluator\n"
        "scored = model.transform(test)\n"
        "auc = BinaryClassificationEvaluator(labelCol='label').evaluate(scored)\n"
        "acc = MulticlassClassificationEvaluator(labelCol='label', metricName='accuracy').evaluate(scored)\n"
        "print(f'test AUC {auc:.4f}, accuracy {acc:.4f}')\n"
        "assert auc > 0.95, auc",
    ),
    (
        "md",
        "## Against Spark's own forest and a single member\nMLlib's `RandomForestClassifier` with the "
        "same number and depth of trees, on the same split; one member alone shows what voting adds.",
    ),
    (
        "code",
        "import numpy as np\nfrom pyspark.ml.classification import RandomForestClassifier\n"
        "from pyspark.ml.feature import VectorAssembler\n"
        "from sklearn.metrics import roc_auc_score, roc_curve\n"
        "import matplotlib.pyplot as plt\n"
        "assemble = VectorAssembler(inputCols=feature_cols, outputCol='features')\n"
        "forest = RandomForestClassifier(numTrees=16, maxDepth=6, seed=7).fit(assemble.transform(train))\n"
        "rows = forest.transform(assemble.transform(test)).select(*feature_cols, 'label', 'probability').toPandas()\n"
        "y_test = rows['label'].to_numpy()\n"
        "member = model.models[0]\n"
        "scores = {\n"
        "    'BaggingClassifier (16 trees)': model.predict_proba(rows[feature_cols])[:, 1],\n"
        "    'MLlib RandomForest (16 trees)': np.stack(rows['probability'].map(lambda v: v.toArray()))[:, 1],\n"
        "    'one member': member.model.predict_proba(rows[feature_cols].to_numpy()[:, member.features])[:, 1],\n"
        "}\n"
        "fig, (roc, sizes) = plt.subplots(1, 2, figsize=(9, 3.4))\n"
        "for name, s in scores.items():\n"
        "    fpr, tpr, _ = roc_curve(y_test, s)\n"
        "    roc.plot(fpr, tpr, label=f'{name}: AUC {roc_auc_score(y_test, s):.3f}')\n"
        "roc.set_xlabel('false positive rate'); roc.set_ylabel('true positive rate'); roc.legend(loc='lower right')\n"
        "sizes.bar(range(len(model.groupSizes)), model.groupSizes, color='#9ab')\n"
        "sizes.set_xlabel('member'); sizes.set_ylabel('rows (bootstrap copies)'); sizes.set_title('group sizes')\n"
        "plt.tight_layout(); plt.show()\n"
        "print({name: round(roc_auc_score(y_test, s), 4) for name, s in scores.items()})",
    ),
    ("md", "The same model scores local numpy/pandas data with the same numbers:"),
    (
        "code",
        "import numpy as np\n"
        "local = scored.select(*feature_cols, 'probability').toPandas()\n"
        "p_local = model.predict_proba(local[feature_cols])\n"
        "p_spark = np.stack(local['probability'].map(lambda v: v.toArray()))\n"
        "print('max |local - spark| =', np.abs(p_local - p_spark).max())\n"
        "assert np.allclose(p_local, p_spark)",
    ),
    ("md", "## Save and load"),
    (
        "code",
        "import tempfile\nfrom sparkml_dist.ensemble import BaggingClassificationModel\n"
        "path = tempfile.mkdtemp() + '/bag'\n"
        "model.write().overwrite().save(path)\n"
        "loaded = BaggingClassificationModel.load(path)\n"
        "same = loaded.transform(test).select('prediction').toPandas().equals(scored.select('prediction').toPandas())\n"
        "print('reloaded model predicts the same:', same)\nassert same",
    ),
    ("code", "spark.stop()\nprint('Spark stopped')"),
]

if __name__ == "__main__":
    write(cells, "01_ensembles.ipynb")
