"""ckpt.numerics: the torch math of ckpt's analyzers. Provisional: it may change without a deprecation.

The parameter space (:mod:`~ckpt.numerics.params`); per-datapoint derivatives, Jacobian- and
Hessian-vector products and the loss over it (:mod:`~ckpt.numerics.derivatives`, with the
forward-mode rules of :mod:`~ckpt.numerics.norms`), their compiled first-order passes
(:mod:`~ckpt.numerics.compiled`); Lanczos eigenpairs (:mod:`~ckpt.numerics.lanczos`, its sizes
:mod:`~ckpt.numerics.lanczos_sizes`, its vectors :mod:`~ckpt.numerics.vector_rows`); the stored
basis format (:mod:`~ckpt.numerics.basis_format`); activation capture
(:mod:`~ckpt.numerics.activations`), models built without weights
(:mod:`~ckpt.numerics.weightless`), a twice-differentiable token cross-entropy
(:mod:`~ckpt.numerics.cross_entropy`) and allocation counts (:mod:`~ckpt.numerics.footprint`).

Plugin authors use the names :mod:`ckpt.plugins` re-exports; the modules here are for
ckpt's own analyzers and may be renamed, merged or changed between releases. Beneath the
plugin host and the engine: it imports :mod:`ckpt.store` and :mod:`ckpt.errors`, never
:mod:`ckpt.plugins` or :mod:`ckpt.engine`. Importing the package imports no torch.
"""

__all__: list[str] = []
