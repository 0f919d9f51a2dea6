"""Support vector machines checked before libsvm walks them.  [anywhere]

A fitted ``SVC``, ``NuSVC``, ``SVR``, ``NuSVR`` or ``OneClassSVM`` predicts in libsvm's C code,
which walks its support vectors by the counts and coefficients the model holds, unchecked: a
crafted model with ``support_`` longer than its support vectors segfaults, one with too small a
``_dual_coef_`` reads past it. :func:`libsvm_fault` (which :func:`~.checks.check_sklearn` asks of
every support vector machine it meets, on both model routes, refusing what it names) finds a model
whose ``support_``, ``support_vectors_`` and ``_n_support`` disagree on how many support vectors
there are (``len(support_) == len(support_vectors_) == _n_support.sum()`` for a classifier), whose
``_dual_coef_`` is not ``(n_class - 1, l)``, whose intercepts or ``_probA``/``_probB`` are not one
per pair of classes, whose precomputed-kernel indices fall outside its training samples, or whose
sparse matrices have indices out of range.

Example::

    libsvm_fault(svc, svc.n_features_in_)      # "" or what is wrong ("has _dual_coef_ of shape ...")
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _int_array(value: Any, dims: int) -> bool:
    return isinstance(value, np.ndarray) and value.ndim == dims and value.dtype.kind in "iu"


def libsvm_fault(est: Any, width: int) -> str:
    """What is wrong with a fitted support vector machine of input width ``width`` ('' when
    nothing: see the module docstring)."""
    import scipy.sparse as sp

    sv, support, counts = est.support_vectors_, est.support_, est._n_support
    if not _int_array(support, 1) or not _int_array(counts, 1):
        return "has support_ or _n_support that are not 1-d integer arrays"
    n = len(support)
    if (
        getattr(sv, "ndim", 0) != 2
        or sv.shape[0] != n
        and not (est.kernel == "precomputed" and sv.shape[0] == 0)
    ):
        return f"has {getattr(sv, 'shape', None)} support vectors for {n} support_ indices"
    if est.kernel == "precomputed":
        fit = getattr(est, "shape_fit_", None)
        if not (isinstance(fit, (tuple, list)) and len(fit) == 2 and all(isinstance(v, int) for v in fit)):
            return f"has shape_fit_ {fit!r}, not (samples, features) of its training"
        if n and (support.min() < 0 or support.max() >= fit[0]):
            return f"has support_ indices outside [0, {fit[0]}) of its training samples"
    elif est.kernel in ("linear", "poly", "rbf", "sigmoid") and sv.shape[1] != width:
        return f"has support vectors {sv.shape[1]} wide, not n_features_in_={width}"
    classifier = est._impl in ("c_svc", "nu_svc")
    classes = len(getattr(est, "classes_", ())) if classifier else 2
    if classifier and (len(counts) != classes or counts.min(initial=0) < 0 or int(counts.sum()) != n):
        return (f"has _n_support {counts.tolist()} that does not split {n} support vectors "
                f"among {classes} classes")  # fmt: skip
    if not classifier and (len(counts) != 2 or counts.min() < 0 or counts.max() > n):
        return f"has _n_support {counts.tolist()} for {n} support vectors"
    pairs = classes * (classes - 1) // 2
    coef = est._dual_coef_
    if getattr(coef, "shape", None) != (classes - 1, n) or (sp.issparse(coef) and coef.nnz != coef.size):
        shape = getattr(coef, "shape", None)
        return f"has _dual_coef_ of shape {shape}, not ({classes - 1}, {n})"
    for name, lengths in (("_intercept_", (pairs,)), ("_probA", (0, pairs)), ("_probB", (0, pairs))):
        value = getattr(est, name, None)
        if not isinstance(value, np.ndarray) or value.ndim != 1 or len(value) not in lengths:
            shape = getattr(value, "shape", None)
            return f"has {name} of shape {shape}, not of length {lengths}"
    weights = getattr(est, "class_weight_", None)
    if (
        classifier
        and sp.issparse(sv)
        and (not isinstance(weights, np.ndarray) or weights.shape != (classes,))
    ):
        return f"has class_weight_ for other than its {classes} classes"
    for name, matrix in (("support_vectors_", sv), ("_dual_coef_", coef)):
        if sp.issparse(matrix):
            try:
                matrix.check_format(full_check=True)
            except (ValueError, TypeError, AttributeError) as exc:
                return f"has a sparse {name} whose indices are not valid ({exc})"
            if matrix.format != "csr":
                return f"has a sparse {name} in {matrix.format} format, not csr"
    return ""
