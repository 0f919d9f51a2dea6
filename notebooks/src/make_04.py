"""Writes notebooks/04_parallel_models.ipynb (kept as code so reviews see plain diffs)."""

from nbwrite import write

cells = [
    (
        "md",
        "# Many independent models in parallel\n\nThe simplest distributed ML: models that never talk "
        "to each other. First a **parameter search** (every candidate x fold is one fit on Spark, "
        "results identical to scikit-learn's `GridSearchCV`), then **one model per key** "
        "(`GroupedTrainer`), and the **memory planner** that decides how many fit at once.",
    ),
    (
        "code",
        "import os, sys\nos.environ.setdefault('PYSPARK_PYTHON', sys.executable)\n"
        "from pyspark.sql import SparkSession\n"
        "spark = (SparkSession.builder.master('local[2]').appName('04_parallel_models')\n"
        "         .config('spark.ui.enabled', 'false').config('spark.sql.shuffle.partitions', '4')\n"
        "         .getOrCreate())\n"
        "print('Spark', spark.version, 'on', spark.sparkContext.master)",
    ),
    (
        "md",
        "## Parameter search on the digits\n`ParallelSearchCV` takes the arguments of `GridSearchCV` "
        "plus `max_concurrent` (how many fits at once; `None` asks the planner).",
    ),
    (
        "code",
        "import numpy as np, pandas as pd\nfrom sklearn.datasets import load_digits\n"
        "from sklearn.ensemble import RandomForestClassifier\n"
        "from sklearn.model_selection import GridSearchCV\n"
        "from sparkml_dist.search import ParallelSearchCV\n"
        "X, y = load_digits(return_X_y=True)\n"
        "grid = {'n_estimators': [20, 50], 'max_depth': [6, None], 'max_features': ['sqrt', 0.3]}\n"
        "search = ParallelSearchCV(RandomForestClassifier(random_state=0), grid, cv=3).fit(X, y)\n"
        "print('best', search.best_params_, round(search.best_score_, 4))\n"
        "pd.DataFrame(search.cv_results_)[['params', 'mean_test_score', 'rank_test_score']]"
        ".sort_values('rank_test_score').head()",
    ),
    (
        "code",
        "reference = GridSearchCV(RandomForestClassifier(random_state=0), grid, cv=3).fit(X, y)\n"
        "assert np.array_equal(search.cv_results_['mean_test_score'], reference.cv_results_['mean_test_score'])\n"
        "assert search.best_params_ == reference.best_params_\n"
        "print('identical to scikit-learn: every split score, the ranks and the best candidate')",
    ),
    (
        "md",
        "The search's score surface: mean cross-validated accuracy of every candidate, one panel "
        "per `max_features`.",
    ),
    (
        "code",
        "import matplotlib.pyplot as plt\n"
        "res = pd.DataFrame(search.cv_results_)\n"
        "fig, axes = plt.subplots(1, 2, figsize=(8, 3), sharey=True)\n"
        "for ax, mf in zip(axes, grid['max_features']):\n"
        "    part = res[res.param_max_features == mf]\n"
        "    table = part.pivot_table(index=part.param_max_depth.astype(str), columns='param_n_estimators',\n"
        "                             values='mean_test_score')\n"
        "    im = ax.imshow(table.to_numpy(), cmap='viridis', vmin=res.mean_test_score.min(), vmax=res.mean_test_score.max())\n"
        "    for (i, j), v in np.ndenumerate(table.to_numpy()):\n"
        "        ax.text(j, i, f'{v:.3f}', ha='center', va='center', color='w')\n"
        "    ax.set_xticks(range(table.shape[1]), table.columns); ax.set_yticks(range(table.shape[0]), table.index)\n"
        "    ax.set_xlabel('n_estimators'); ax.set_title(f'max_features={mf}')\n"
        "axes[0].set_ylabel('max_depth'); fig.colorbar(im, ax=axes, label='mean CV accuracy'); plt.show()",
    ),
    (
        "md",
        "## One model per store\nA toy sales table where each store reacts differently to price. "
        "`GroupedTrainer` fits one `Ridge` per store, in the task that holds the store's rows.",
    ),
    (
        "code",
        "from sklearn.linear_model import Ridge\nfrom sparkml_dist.ensemble import GroupedTrainer\n"
        "rng = np.random.default_rng(0)\nn = 3000\n"
        "stores = rng.choice([f'store_{i}' for i in range(12)], n)\n"
        "slope = {s: rng.uniform(-3, 3) for s in np.unique(stores)}\n"
        "price, promo = rng.normal(size=n), rng.integers(0, 2, n)\n"
        "sales = np.array([slope[s] for s in stores]) * price + 0.5 * promo + rng.normal(scale=0.1, size=n)\n"
        "df = spark.createDataFrame(pd.DataFrame({'store': stores, 'price': price, 'promo': promo.astype(float), 'sales': sales}))\n"
        "model = GroupedTrainer(estimator=Ridge(alpha=0.1), groupCol='store', featuresCols=['price', 'promo'],\n"
        "                       labelCol='sales').fit(df)\n"
        "learned = {k: round(float(m.coef_[0]), 2) for k, m in model.models.items()}\n"
        "print(len(learned), 'models;', list(learned.items())[:4])\n"
        "assert all(abs(learned[s] - slope[s]) < 0.1 for s in learned)",
    ),
    (
        "code",
        "scored = model.transform(df)\n"
        "err = scored.selectExpr('avg(abs(prediction - sales)) AS mae').first().mae\n"
        "print(f'mean absolute error {err:.3f}')\nassert err < 0.2",
    ),
    (
        "md",
        "## How many models fit at once?\nThe memory rule: parameters x bytes per parameter, x 2 "
        "when trained by backpropagation, x batch size, x steps. The planner divides the Python "
        "memory of an executor by it and caps by the task slots.",
    ),
    (
        "code",
        "import torch\nfrom sparkml_dist.plan import model_bytes, plan_concurrency\n"
        "net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))\n"
        "need = model_bytes(net, precision='fp32', backprop=True, batch_size=64)\n"
        "print(f'{need / 2**20:.1f} MiB per model;', plan_concurrency(spark, need).summary())",
        "vary",
    ),
    ("code", "spark.stop()\nprint('Spark stopped')"),
]

if __name__ == "__main__":
    write(cells, "04_parallel_models.ipynb")
