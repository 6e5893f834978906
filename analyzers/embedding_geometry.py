"""``embedding-geometry``: circles, grids and clusters in an embedding table, at every checkpoint.

The geometry that "Clustering and Alignment" (modular addition, 2-D token
embeddings) and "Clustering Head" (sparse modular addition, 2-D sequence
embeddings) plot, measured as numbers so that they can be followed through
training. For the embedding table ``E`` (``--tensor``, ``[rows, dim]``) the
residues are its first ``N`` rows (``--modulus N``, default all rows), and at
every checkpoint:

**Circularity.** Centre the rows, ``C_a = E_a - mean``, and take the DFT over the
token index, ``F_k = sum_a C_a exp(-2 pi i k a / N)`` (one complex vector per
frequency). The power of frequency ``k = 1 .. N//2`` is ``|F_k|^2 + |F_{N-k}|^2``
summed over the dimensions (``k`` and ``N-k`` are one real frequency; ``N/2``
counted once). ``circularity`` is the largest share of the total power
(Parseval: ``N * sum_a |C_a|^2``) held by one frequency, ``circle_frequency``
that frequency, and ``frequency_share`` the whole spectrum. A circle traversed
``k`` times, ``E_a = r (cos 2 pi k a / N, sin 2 pi k a / N)``, has circularity 1
at frequency ``k``. ``radial_cv`` is the coefficient of variation (std / mean)
of the radii ``|C_a|``: 0 on any circle centred at the mean. For ``N <= 3``
there is only one frequency, so circularity is 1 by construction.

**Pair sums.** The model of modular addition reads ``S_ab = E_a + E_b``; for
every unordered pair ``a <= b`` of residues (``N (N+1) / 2`` of them), class
``(a + b) mod N``. ``pair_sum_within_share`` is the within-class spread over the
total spread, ``sum |S_ab - mean of its class|^2 / sum |S_ab - mean of all|^2``.
Beware: for odd N it is the constant ``1 - 2 / ((N+1)(N+2))`` for *every*
embedding. Each class holds every residue once, plus its half ``h = c/2`` once
more, so a class mean is ``(sum_a E_a + E_h) / ((N+1)/2)``: class means differ
only through ``E_h``, and both spreads are fixed multiples of the embeddings'
variance. (Linear pair sums cannot separate the classes; the MLP's
nonlinearity does.) For even N it varies, little. Distance-based statistics do
see the structure: ``pair_sum_silhouette`` is the mean silhouette of the pair
sums under the class labels (``sklearn.metrics.silhouette_score``, Euclidean;
negative when classes are split over several places, as on grids), and
``pair_sum_neighbor_agreement`` the share of pair sums whose nearest other pair
sum has the same class (about 1/N for random embeddings; 0.97 on an ideal line
and 0.91 on a 2-D grid of 17 residues, 0.44 on a circle).

**Grid imperfection.** An *ideal grid* (Clustering and Alignment) puts the
residues on a lattice so that a pair sum's position determines its class:
``E_a = c + A z_a`` with integer coordinates ``z_a`` that add like the residues.
A 1-D grid is an evenly spaced line read in the order ``a0, a0+g, a0+2g, ...``
(mod N); a 2-D grid reads that order row by row, rows of ``m`` residues, so that
one step along a row adds ``g`` and one step across rows adds ``m g`` (mod N).
Formally, for an offset ``a0``, a generator ``g`` (a unit mod N) and a row length
``m`` in ``2 .. N`` let ``i_a = (a - a0) g^{-1} mod N`` and
``z_a = (i_a mod m, i_a div m)`` (``m = N``: the line, ``z_a = i_a``). Then
``z_a + z_b = z_c + z_d`` implies ``a + b = c + d (mod N)``, and
``E_a + E_b = 2c + A (z_a + z_b)``: pair sums that coincide have the same class.
The grid imperfection is the share of the pair sums' spread that the best such
lattice leaves unexplained::

    G = min over (a0, g, m)  min over c, A  sum_{a<=b} |S_ab - 2c - A(z_a + z_b)|^2 / sum_{a<=b} |S_ab - mean S|^2

Because ``sum_{a<=b} |r_a + r_b|^2 = (N+2) sum_a |r_a|^2 + |sum_a r_a|^2``, this is
exactly the share of the embeddings' own variance not explained by an affine
least-squares fit ``E_a ~ c + A z_a`` (the residuals of a fit with an intercept
sum to zero), which is how it is computed. ``G`` is 0 exactly for ideal grids
(lines and reading-order 2-D lattices, any offset, generator, row length,
spacing, shear, rotation and scale), positive otherwise, and invariant to
translating, rotating and scaling ``E``. With ``a0 = 0``, ``g = 1``, ``m = N`` it
is the simplest form, "pair sums grouped by the integer sum a + b" (0 exactly
when ``E_a = c + a u``); minimising over labelings makes it independent of how
the grid is laid out. ``grid_offset``, ``grid_generator`` and ``grid_row_length``
name the best lattice (ties go to the line, then to the smallest row length).
The search has ``N * phi(N) * (N - 1)`` labelings, so it is skipped (NaN) above
``--grid-max-tokens`` residues (default 64). The pair-sum metrics are skipped (NaN) above
``--pair-sum-max-tokens`` residues (default 256, the figures' limit): a language model's table
has ``N (N+1) / 2`` = 1.26 billion pair sums at GPT-2's vocabulary and no residues to group them
by; circularity and the radii stay O(N d).

**Sequence embeddings** (``--sequence on``, or ``auto`` on stores trained by the
``sparse-modular-addition`` sandbox). The probe set is every one of the ``p^k``
prefixes of the ``k`` relevant tokens (base-p order, first token most
significant, as the sandbox's ``prefix`` label) followed by each of
``--suffixes`` random suffixes of ``L - k`` spurious tokens (drawn once from
``numpy.random.default_rng(--seed)``, the same suffixes for every prefix). The
sequence embedding ξ of a probe is the output of the module ``--module``
(default ``attn``: in the Clustering Head transformer the attention output, the
vector the MLP reads), captured with a forward hook during the model's own
forward pass with the checkpoint's weights; an output with a sequence axis
(``[batch, L, d]``) contributes its last position. Then

- ``sequence_clusters``: single-linkage clusters of ξ with distance threshold
  ``--cluster-tolerance`` times the RMS spread ``sqrt(mean |ξ - mean ξ|^2)``, i.e.
  the connected components of "closer than the tolerance" (unique, no random
  start, no preset count); ``ideal_clusters`` = C(k + p - 1, k), the number of
  multisets of k tokens, since the target depends only on the counts of each
  symbol and a model that attends uniformly to the prefix maps every multiset
  to one point;
- ``suffix_share``: spread of ξ within groups of probes that differ only in
  their suffix, over the total spread (0 = ξ ignores the spurious tokens);
- ``multiset_share``: the same within groups sharing the prefix's multiset
  (0 = ξ depends only on the counts);
- ``sequence_embedding``: ξ itself (``probe, component``), with the probes'
  ``prefix``, ``suffix`` and ``target`` as coordinates.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt.analyzers._geometry_metrics import (
    circularity,
    cluster_count,
    fourier_spectrum,
    grid_imperfection,
    grid_labelings,
    ideal_cluster_count,
    neighbor_agreement,
    pair_sums,
    radial_cv,
    silhouette,
    within_share,
)
from ckpt.analyzers.figures.tokens import PAIR_SUM_MAX_TOKENS
from ckpt.plugins import AnalysisContext, AnalysisError, Analyzer, Option, Worker
from ckpt.plugins.manager import analyzer_hook

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr
    from matplotlib.figure import Figure

SEQUENCE_TASK = "sparse-modular-addition"
"""Stores trained by this sandbox task get the sequence metrics with ``--sequence auto``."""


def probe_sequences(p: int, k: int, length: int, suffixes: int, seed: int) -> dict[str, np.ndarray]:
    """Every prefix of ``k`` tokens followed by each of ``suffixes`` seeded random suffixes.

    Returns
    -------
    dict[str, np.ndarray]
        ``tokens`` int64 ``[p^k * suffixes, length]`` (prefix-major), and per probe
        ``prefix`` (base-p code, first token most significant), ``suffix`` (its
        index), ``multiset`` (an id of the prefix's token counts) and ``target``
        (prefix sum mod p).
    """
    prefixes = np.array(np.unravel_index(np.arange(p**k), (p,) * k)).T.astype(np.int64)  # base-p order
    rng = np.random.default_rng(seed)
    tails = rng.integers(0, p, size=(suffixes, length - k), dtype=np.int64)
    tokens = np.concatenate([np.repeat(prefixes, suffixes, axis=0), np.tile(tails, (p**k, 1))], axis=1)
    counts = np.stack([(prefixes == v).sum(1) for v in range(p)], axis=1)
    _, multiset = np.unique(counts, axis=0, return_inverse=True)
    return {
        "tokens": tokens,
        "prefix": np.repeat(np.arange(p**k, dtype=np.int64), suffixes),
        "suffix": np.tile(np.arange(suffixes, dtype=np.int64), p**k),
        "multiset": np.repeat(multiset.reshape(-1).astype(np.int64), suffixes),
        "target": np.repeat(prefixes.sum(1) % p, suffixes),
    }


# -- the worker task ------------------------------------------------------------------------------


def _sequence_embeddings(worker: Worker, step: int, tokens: np.ndarray, module: str) -> np.ndarray:
    """ξ of ``tokens``: the output of submodule ``module`` in a forward pass at ``step``."""
    import torch

    model = worker.model  # one per thread: the hook below is this thread's only
    target = model.get_submodule(module)
    captured: list[Any] = []

    def hook(_module: Any, _inputs: Any, output: Any) -> None:
        captured.append(output[0] if isinstance(output, tuple) else output)

    handle = target.register_forward_hook(hook)
    try:
        with torch.no_grad():
            worker.outputs(worker.params(step), torch.as_tensor(tokens, device=worker.device))
    finally:
        handle.remove()
    xi = captured[-1]
    if xi.ndim == 3:
        xi = xi[:, -1]
    return xi.reshape(len(tokens), -1).double().cpu().numpy()


def embedding_geometry(
    worker: Worker,
    step: int,
    *,
    tensor: str,
    modulus: int,
    grid_max_tokens: int,
    probes: dict[str, np.ndarray] | None,
    pair_sum_max_tokens: int = PAIR_SUM_MAX_TOKENS,
    module: str | None,
    tolerance: float,
    ideal: int,
) -> dict[str, np.ndarray]:
    """Every metric of the module docstring at ``step`` (runs on a worker)."""
    table = worker.tensors(step, [tensor])[tensor].astype(np.float64)[:modulus]
    share, frequency = circularity(table)
    if modulus <= pair_sum_max_tokens:
        sums, classes = pair_sums(table, modulus)
        pair_metrics = (within_share(sums, classes), silhouette(sums, classes), neighbor_agreement(sums, classes))
    else:  # N (N+1) / 2 pair sums: 1.26 billion at GPT-2's vocabulary, and no residues to group them by
        pair_metrics = (math.nan, math.nan, math.nan)
    if modulus <= grid_max_tokens:
        imperfection, (offset, generator, rows) = grid_imperfection(table)
    else:
        imperfection, (offset, generator, rows) = math.nan, (-1, -1, -1)
    out = {
        "circularity": np.array(share),
        "circle_frequency": np.array(frequency, dtype=np.int64),
        "frequency_share": fourier_spectrum(table),
        "radial_cv": np.array(radial_cv(table)),
        "pair_sum_within_share": np.array(pair_metrics[0]),
        "pair_sum_silhouette": np.array(pair_metrics[1]),
        "pair_sum_neighbor_agreement": np.array(pair_metrics[2]),
        "grid_imperfection": np.array(imperfection),
        "grid_offset": np.array(offset, dtype=np.int64),
        "grid_generator": np.array(generator, dtype=np.int64),
        "grid_row_length": np.array(rows, dtype=np.int64),
    }
    if probes is not None:
        xi = _sequence_embeddings(worker, step, probes["tokens"], module or "attn")
        out.update(
            sequence_embedding=xi,
            sequence_clusters=np.array(cluster_count(xi, tolerance), dtype=np.int64),
            ideal_clusters=np.array(ideal, dtype=np.int64),
            suffix_share=np.array(within_share(xi, probes["prefix"])),
            multiset_share=np.array(within_share(xi, probes["multiset"])),
        )
    return out


# -- the analyzer ---------------------------------------------------------------------------------


def _is_float(dtype: str) -> bool:
    return "float" in dtype


def default_embedding(store: Any) -> str | None:
    """The token embedding of a store (the rule of ``--tensor``'s default), or None.

    Among the 2-D floating-point tensors: the one named ``embed.weight``; else the
    first, in the store's tensor order, whose name ends with ``embed.weight``
    (``tok_embed.weight``, ``model.embed.weight``); else, when the store records a
    model, the weight of its first ``torch.nn.Embedding`` in module registration order.
    """
    candidates = [name for name, info in store.schema.items() if len(info.shape) == 2 and _is_float(info.dtype)]
    for rule in (lambda n: n == "embed.weight", lambda n: n.endswith("embed.weight")):
        found = [n for n in candidates if rule(n)]
        if found:
            return found[0]
    if store.model is None:
        return None
    import torch

    try:  # on meta: the modules without weights, which a store imported with --tensors has too
        model = store.model.on_meta()
        model = store.model.build() if model is None else model
    except Exception:  # a model that does not build simply offers no nn.Embedding
        return None
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Embedding) and f"{name}.weight" in candidates:
            return f"{name}.weight"
    return None


class EmbeddingGeometry(Analyzer):
    """Circularity, pair-sum clustering, grid imperfection and sequence-embedding clusters per checkpoint."""

    name = "embedding-geometry"
    version = "1"
    description = "Circles, grids and clusters of an embedding table (and of sequence embeddings) at every checkpoint."

    tensor = Option(str, None, "Embedding table [tokens, dim] (default: the token embedding, see docs).")
    modulus = Option(
        int, None, "Residues N: rows 0..N-1 of the table, pair sums grouped mod N (default: all rows).", minimum=2
    )
    grid_max_tokens = Option(int, 64, "Skip the grid search (NaN) above this many residues.", minimum=1)
    pair_sum_max_tokens = Option(
        int,
        PAIR_SUM_MAX_TOKENS,
        "Skip the pair-sum metrics (NaN) above this many residues: N(N+1)/2 pair sums.",
        minimum=2,
    )
    sequence = Option(
        str,
        "auto",
        "Sequence embeddings: on, off, or auto (on for sparse-modular-addition stores).",
        choices=["auto", "on", "off"],
    )
    k = Option(int, None, "Relevant prefix tokens k (default: the store's config).", minimum=1)
    module = Option(str, "attn", "Submodule whose output is the sequence embedding.")
    suffixes = Option(int, 4, "Random suffixes of spurious tokens per prefix.", minimum=1)
    seed = Option(int, 0, "Seed of the suffixes.", minimum=0)
    cluster_tolerance = Option(
        float, 0.05, "Single-linkage distance threshold, relative to the RMS spread of xi.", minimum=0
    )

    def _table(self, store: Any) -> tuple[str, int]:
        names = store.tensor_names
        name = self.tensor
        if name is None:
            name = default_embedding(store)
            if name is None:
                msg = f"{store.path} has no token embedding (*embed.weight or an nn.Embedding): pass --tensor NAME"
                raise AnalysisError(msg)
        if name not in store.schema:
            msg = f"unknown tensor {name!r}: pass --tensor with one of {', '.join(names)}"
            raise AnalysisError(msg)
        info = store.schema[name]
        if len(info.shape) != 2 or not _is_float(info.dtype):
            msg = (
                f"tensor {name!r} is {info.dtype} of shape {tuple(info.shape)}, not a 2-D floating-point "
                "[tokens, dim] table: pass --tensor NAME of an embedding table"
            )
            raise AnalysisError(msg)
        rows = int(info.shape[0])
        modulus = rows if self.modulus is None else self.modulus
        if not 2 <= modulus <= rows:
            msg = f"--modulus must be between 2 and the {rows} rows of {name!r}, got {modulus}"
            raise AnalysisError(msg)
        return name, modulus

    def _probes(self, store: Any, modulus: int) -> tuple[dict[str, np.ndarray] | None, int, int]:
        """The probe set, the ideal cluster count and the width of ξ (``None, 0, 0`` without sequences)."""
        attrs = store.attrs
        config = attrs.get("config") if isinstance(attrs.get("config"), dict) else {}
        on = self.sequence == "on" or (self.sequence == "auto" and attrs.get("task") == SEQUENCE_TASK)
        if not on:
            return None, 0, 0
        if store.model is None:
            msg = f"{store.path} records no model, so sequence embeddings cannot be computed: pass --sequence off"
            raise AnalysisError(msg)
        p = int(config.get("p", modulus))
        k = self.k if self.k is not None else config.get("k")
        length = config.get("length")
        if length is None and "eval" in store.splits:
            inputs = store.data("eval")["inputs"]
            length = inputs.shape[1] if inputs.ndim == 2 else None
        if k is None or length is None:
            msg = "sequence embeddings need k and the sequence length: pass -k K (length is read from the eval split)"
            raise AnalysisError(msg)
        k, length = int(k), int(length)
        if not 1 <= k <= length or self.suffixes < 1:
            msg = f"need 1 <= k <= length and --suffixes >= 1, got k={k}, length={length}, suffixes={self.suffixes}"
            raise AnalysisError(msg)
        probes = probe_sequences(p, k, length, self.suffixes, self.seed)
        return probes, ideal_cluster_count(p, k), _probe_width(store, self.module, probes["tokens"][:1])

    def data_splits(self, store: Any) -> tuple[str, ...]:
        """None: computed from the weights alone."""
        return ()

    def compute(self, ctx: AnalysisContext) -> xr.Dataset:
        """The metrics for ``ctx.steps``, lazily: one Dask task per checkpoint."""
        name, modulus = self._table(ctx.store)
        probes, ideal, xi_dim = self._probes(ctx.store, modulus)
        outputs: dict[str, tuple[tuple[str, ...], Any]] = {
            "circularity": ((), np.float64),
            "circle_frequency": ((), np.int64),
            "frequency_share": (("frequency",), np.float64),
            "radial_cv": ((), np.float64),
            "pair_sum_within_share": ((), np.float64),
            "pair_sum_silhouette": ((), np.float64),
            "pair_sum_neighbor_agreement": ((), np.float64),
            "grid_imperfection": ((), np.float64),
            "grid_offset": ((), np.int64),
            "grid_generator": ((), np.int64),
            "grid_row_length": ((), np.int64),
        }
        sizes = {"frequency": modulus // 2}
        coords: dict[str, Any] = {"frequency": np.arange(1, modulus // 2 + 1, dtype=np.int64)}
        if probes is not None:
            outputs.update(
                sequence_embedding=(("probe", "component"), np.float64),
                sequence_clusters=((), np.int64),
                ideal_clusters=((), np.int64),
                suffix_share=((), np.float64),
                multiset_share=((), np.float64),
            )
            sizes.update(probe=len(probes["tokens"]), component=xi_dim)
            coords.update(
                prefix=("probe", probes["prefix"]),
                suffix=("probe", probes["suffix"]),
                target=("probe", probes["target"]),
            )
        result = ctx.map_checkpoints(
            embedding_geometry,
            outputs,
            sizes=sizes,
            coords=coords,
            tensor=name,
            modulus=modulus,
            grid_max_tokens=self.grid_max_tokens,
            pair_sum_max_tokens=self.pair_sum_max_tokens,
            probes=probes,
            module=self.module,
            tolerance=self.cluster_tolerance,
            ideal=ideal,
        )
        meanings = {
            "circularity": "largest share of the centred rows' Fourier power at one frequency",
            "circle_frequency": "frequency (1..N//2) holding that share",
            "frequency_share": "share of the Fourier power at each frequency",
            "radial_cv": "std / mean of the rows' distances to their mean",
            "pair_sum_within_share": "within-class over total spread of E_a+E_b, classes (a+b) mod N",
            "pair_sum_silhouette": "silhouette of E_a+E_b under the classes (a+b) mod N",
            "pair_sum_neighbor_agreement": "share of pair sums whose nearest other pair sum has the same class",
            "grid_imperfection": "share of pair-sum spread left by the best reading-order lattice (0 = ideal grid)",
            "grid_offset": "best lattice: residue at its origin",
            "grid_generator": "best lattice: residue step along a row",
            "grid_row_length": "best lattice: residues per row (N = a line)",
            "sequence_embedding": f"output of {self.module!r} on the probe sequences",
            "sequence_clusters": f"single-linkage clusters of xi at {self.cluster_tolerance} x its RMS spread",
            "ideal_clusters": "C(k+p-1, k): multisets of the k relevant tokens",
            "suffix_share": "spread of xi within probes sharing a prefix, over the total spread",
            "multiset_share": "spread of xi within probes sharing the prefix's token counts, over the total spread",
        }
        for variable in result.data_vars:
            result[variable].attrs.update(description=meanings[variable], tensor=name, modulus=modulus)
        result.attrs.update(tensor=name, modulus=modulus)
        return result

    def plot(self, result: xr.Dataset, store: Any) -> dict[str, Figure]:
        """``embeddings`` at chosen steps with pair sums, and ``geometry`` over steps."""
        from ckpt.analyzers.figures.geometry import figures

        tensor, modulus = self._table(store)
        return figures(result, store, tensor, modulus)

    def summarize(self, result: xr.Dataset) -> str:
        """The metrics at the first, a few middle, and the last steps."""
        options = result.ckpt.options
        variable = result["circularity"]
        tensor = options.get("tensor") or variable.attrs.get("tensor") or "the token embedding"
        modulus = variable.attrs.get("modulus", options.get("modulus"))
        steps = result["step"].values
        picks = sorted({0, *np.linspace(0, len(steps) - 1, 6).astype(int).tolist()}) if len(steps) else []
        sequence = "sequence_clusters" in result
        header = (
            f"  {'step':>10}  {'circ (k)':>11}  {'radial cv':>9}  {'within':>7}  {'silh':>6}  {'nn':>6}  {'grid':>6}"
        )
        if sequence:
            header += f"  {'clusters':>9}  {'suffix':>7}  {'multiset':>8}"
        rows = [header]
        for i in picks:
            row = result.isel(step=i)
            line = (
                f"  {int(steps[i]):>10}  {float(row['circularity']):>6.3f} ({int(row['circle_frequency']):>2})"
                f"  {float(row['radial_cv']):>9.3f}  {float(row['pair_sum_within_share']):>7.3f}"
                f"  {float(row['pair_sum_silhouette']):>6.3f}  {float(row['pair_sum_neighbor_agreement']):>6.3f}"
                f"  {float(row['grid_imperfection']):>6.3f}"
            )
            if sequence:
                clusters = f"{int(row['sequence_clusters'])}/{int(row['ideal_clusters'])}"
                line += f"  {clusters:>9}  {float(row['suffix_share']):>7.3f}  {float(row['multiset_share']):>8.3f}"
            rows.append(line)
        intro = f"  tensor {tensor}, residues N={modulus}, {len(steps)} checkpoints"
        most = int(options.get("pair_sum_max_tokens") or PAIR_SUM_MAX_TOKENS)
        if modulus is not None and int(modulus) > most:
            intro += (
                f"\n  pair sums and grid not measured (NaN): {int(modulus):,} residues is over {most}; "
                "pass --modulus N when the first N tokens are the residues"
            )
        legend = [
            "  circ: circularity (best frequency); radial cv: std/mean of the radii",
            "  within: pair-sum within-class share (constant at odd N); silh: pair-sum silhouette",
            "  nn: pair sums whose nearest neighbour shares the class; grid: grid imperfection (0 = ideal grid)",
        ]
        if sequence:
            legend.append("  clusters: xi clusters / ideal C(k+p-1,k); suffix, multiset: within-group shares of xi")
        return "\n".join([intro, *rows, *legend])


def _probe_width(store: Any, module: str, tokens: np.ndarray) -> int:
    """Width of ξ: one forward pass of the freshly built model on one probe (checks ``module`` exists)."""
    import torch

    model = store.model.build().eval()
    try:
        target = model.get_submodule(module)
    except AttributeError:
        modules = ", ".join(n for n, _ in model.named_modules() if n) or "none"
        msg = f"the model has no submodule {module!r}: pass --module with one of {modules}"
        raise AnalysisError(msg) from None
    captured: list[Any] = []
    handle = target.register_forward_hook(
        lambda _m, _i, out: captured.append(out[0] if isinstance(out, tuple) else out)
    )
    try:
        with torch.no_grad():
            model(torch.as_tensor(tokens))
    finally:
        handle.remove()
    xi = captured[-1]
    return int(xi[:, -1].shape[-1] if xi.ndim == 3 else np.prod(xi.shape[1:]))


ckpt_register_analyzers = analyzer_hook(EmbeddingGeometry)


__all__ = [
    "SEQUENCE_TASK",
    "EmbeddingGeometry",
    "circularity",
    "ckpt_register_analyzers",
    "cluster_count",
    "default_embedding",
    "embedding_geometry",
    "fourier_spectrum",
    "grid_imperfection",
    "grid_labelings",
    "ideal_cluster_count",
    "neighbor_agreement",
    "pair_sums",
    "probe_sequences",
    "radial_cv",
    "silhouette",
    "within_share",
]
