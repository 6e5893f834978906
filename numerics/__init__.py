"""ckpt.numerics: the torch math of ckpt's analyzers. Provisional: it may change without a deprecation.

Per-datapoint derivatives, Jacobian- and Hessian-vector products and the loss over a
parameter space (:mod:`~ckpt.numerics.derivatives`), their compiled first-order passes
(:mod:`~ckpt.numerics.compiled`), Lanczos eigenpairs (:mod:`~ckpt.numerics.lanczos`),
activation capture (:mod:`~ckpt.numerics.activations`), models built without weights
(:mod:`~ckpt.numerics.weightless`), a twice-differentiable token cross-entropy
(:mod:`~ckpt.numerics.cross_entropy`) and allocation counts (:mod:`~ckpt.numerics.footprint`).

Plugin authors use the names :mod:`ckpt.plugins` re-exports; the modules here are for
ckpt's own analyzers and may be renamed, merged or changed between releases. Beneath the
plugin host and the engine: it imports :mod:`ckpt.store` and :mod:`ckpt.errors`, never
:mod:`ckpt.plugins` or :mod:`ckpt.engine`. Importing the package imports no torch.
"""

__all__: list[str] = []
