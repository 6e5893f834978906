"""``clusters``: datapoints clustered by their trajectories, and the breakthroughs of each cluster.

"Hidden Breakthroughs in Language Model Training" clusters datapoints whose loss
changes alike during training: HDBSCAN (the ``hdbscan`` library) on trajectories
(rows = datapoints, features = steps), one clustering per basis vector, then
finds each cluster's breakthrough step and whether the aggregate loss hides
it. ``--on`` chooses the trajectories:

- ``polca``: the projected loss of each basis vector, eq. 10 of the paper,
  L_b(x, θ_t) = Σ_(i<t) POLCA(x, b; θ_i) at every checkpoint t = 0..T (so
  L_b(x, θ_0) = 0; ``polca`` stores L_b(x, θ_(i+1)) at the first step of
  transition i, and :func:`ckpt.analyzers.trajectories.from_origin` puts it back
  on the checkpoints), after the paper's filters
  (:func:`ckpt.analyzers.trajectories.polca_filter`): keep the basis vectors whose
  mean L_b(x, θ_T) is below 0, and in them the datapoints whose L_b(x, θ_T) is not
  above 0;
- ``loss``: the exact loss (one clustering); ``loss-change``: its change over each
  checkpoint pair (ℓ(t+1) − ℓ(t), at step t as in POLCA);
- ``fisher``: the projected Fisher information of each basis vector;
- ``lca``: the cumulative LCA of each parameter, over the checkpoints from 0 as
  for POLCA, with the same filters (``--no-filter`` turns them off).

The breakthrough of a cluster is the argmax over checkpoints t of
[f(t+Δ) − f(t)] − [f(t) − f(t−Δ)], f the cluster's median trajectory; it is
*hidden* when it is more than τ steps from the breakthrough of the aggregate curve
(the whole dataset's mean loss, found the same way). These two definitions, with
Δ = 100 and τ = 1000 steps, are not in our reference text of the paper (its
eq. 9 is the POLCA decomposition, eq. 10 the projected loss): they are the
reading ckpt was specified with. See
:mod:`ckpt.analyzers.trajectories` for the exact definitions. On splits with text,
:mod:`ckpt.analyzers.text_labels` adds each cluster's most common tokens and
part-of-speech sequences (spaCy) and the contexts nearest its medoid.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt.analyzers import text_labels
from ckpt.analyzers import trajectories as tr
from ckpt.numerics.basis_format import FOUND_AT
from ckpt.plugins import PER_RUN, AnalysisContext, AnalysisError, Analyzer, Option, datapoint_index
from ckpt.plugins.manager import analyzer_hook

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr
    from matplotlib.figure import Figure

SOURCES = ("loss", "loss-change", "polca", "fisher", "lca")
"""What ``--on`` can cluster."""

_TRAJECTORY = {"loss": "loss", "loss-change": "loss", "polca": "projected_loss", "fisher": "fisher", "lca": "lca"}
_ALLOCATIONS = ("polca", "lca")
"""Per-transition loss allocations: clustered as eq. 10 trajectories over the checkpoints, with the paper's filters."""
_BASIS_COORDS = (FOUND_AT, "tensor", "index", "final_magnitude")


def prepared(trajectories: np.ndarray, *, cumulative: bool, difference: bool, origin: bool) -> np.ndarray:
    """``[step, datapoint]`` float64 trajectories as clustered.

    ``origin``: per-transition rows become eq. 10 trajectories over the checkpoints
    (:func:`ckpt.analyzers.trajectories.from_origin`, after the running sum when
    ``cumulative``); ``difference``: the change over each checkpoint pair (loss change).
    """
    values = np.asarray(trajectories, dtype=np.float64)
    if origin:
        return tr.from_origin(values, cumulative=cumulative)
    if cumulative:
        values = np.cumsum(values, axis=0)
    if difference:
        values = np.diff(values, axis=0)
    return values


def cluster_basis(
    trajectories: np.ndarray,
    aggregate_step: float,
    *,
    steps: np.ndarray,
    cumulative: bool,
    difference: bool,
    origin: bool,
    apply_filter: bool,
    slots: int,
    min_cluster_size: int,
    min_samples: int | None,
    selection: str,
    allow_single_cluster: bool,
    delta: float,
    tau: float,
    label_values: np.ndarray | None,
    binary: bool,
    place_values: np.ndarray | None,
    places: tuple[int, ...],
    place_kinds: tuple[int, ...] = (),
) -> dict[str, np.ndarray]:
    """Filter, cluster and describe the trajectories of one basis vector (a Dask task).

    Parameters
    ----------
    trajectories
        ``[step, datapoint]`` as stored (before ``cumulative`` / ``difference``).
    aggregate_step
        The breakthrough step of the aggregate curve (for the hidden flag).
    steps
        The steps of the trajectories as clustered (the checkpoints, for ``origin``).
    cumulative, difference, origin
        How the stored rows become trajectories (:func:`prepared`).
    apply_filter
        Apply :func:`ckpt.analyzers.trajectories.polca_filter`.
    slots
        Length of the cluster axis.
    min_cluster_size, min_samples, selection, allow_single_cluster
        HDBSCAN settings (:func:`ckpt.analyzers.trajectories.cluster_matrix`).
    delta, tau
        Δ and τ in steps.
    label_values, binary
        The label of every datapoint, and whether it is a 0/1 label (None: no label).
    place_values, places
        The place label of every datapoint (None: the split has none) and the
        places allowed by the restriction.
    place_kinds
        The place values a cluster's make-up (``place_share``) is reported over.
    """
    values = prepared(trajectories, cumulative=cumulative, difference=difference, origin=origin)
    count = values.shape[1]
    finite = np.isfinite(values).all(axis=0)
    if apply_filter:
        basis_kept, kept = tr.polca_filter(values[:, None, :])
        basis_kept, kept = basis_kept[0], kept[0]
    else:
        basis_kept, kept = np.bool_(True), finite
    labels = np.full(count, -1, dtype=np.int64)
    rows = values.T
    if kept.any():
        labels[kept] = tr.cluster_matrix(
            rows[kept],
            min_cluster_size=min_cluster_size,
            min_samples=min_samples,
            selection=selection,
            allow_single_cluster=allow_single_cluster,
        )
    stats = tr.cluster_statistics(rows, labels, slots)
    breakthroughs = np.full(slots, np.nan)
    scores = np.full(slots, np.nan)
    for c in range(slots):
        if stats["size"][c] > 0:
            breakthroughs[c], scores[c] = tr.breakthrough(stats["median"][c], steps, delta)
    result = {
        "cluster_label": labels,
        "filtered": ~kept,
        "basis_kept": np.asarray(basis_kept, dtype=bool),
        "clusters": np.asarray(int(labels.max()) + 1 if labels.size else 0, dtype=np.int64),
        **stats,
        "breakthrough_step": breakthroughs,
        "breakthrough_score": scores,
        "hidden": tr.hidden_flags(breakthroughs, float(aggregate_step), tau),
    }
    if place_values is not None:
        result["place_share"] = tr.value_shares(labels, place_values, slots, place_kinds)
    if label_values is not None:
        scored = tr.label_scores(labels, label_values, slots, binary=binary)
        result.update({f"label_{k}" if k == "value" else k: v for k, v in scored.items()})
        if place_values is not None:
            result["place_fraction"] = tr.place_fractions(labels, label_values, scored["value"], place_values, places)
    return result


def aggregate_breakthrough(curve: np.ndarray, *, steps: np.ndarray, delta: float) -> float:
    """The breakthrough step of the aggregate (mean-loss) curve (a Dask task)."""
    return tr.breakthrough(np.asarray(curve, dtype=np.float64), steps, delta)[0]


def top_ranked(homogeneity: np.ndarray, allowed: np.ndarray | None) -> dict[str, np.ndarray]:
    """The three highest homogeneities over every basis vector and cluster (a Dask task)."""
    values, basis, cluster = tr.top_homogeneities(homogeneity, allowed, k=3)
    return {"top_homogeneity": values, "top_basis": basis, "top_cluster": cluster}


class Clusters(Analyzer):
    """HDBSCAN clusters of datapoint trajectories per basis vector, with their breakthroughs."""

    name = "clusters"
    version = "2"  # 2: polca/lca trajectories over the checkpoints from L(θ_0) = 0 (eq. 10), filters against 0
    description = "HDBSCAN clusters of per-datapoint trajectories (POLCA, loss, ...) and their breakthroughs."
    requires = ("polca",)
    per = PER_RUN

    on = Option(str, "polca", "Trajectories to cluster: loss, loss-change, polca, fisher or lca.", choices=SOURCES)
    split = Option(str, None, "Split passed to the analyzer clustered (default: the options of its stored result).")
    min_cluster_size = Option(int, 150, "HDBSCAN min_cluster_size (the paper: 150).", minimum=2)
    min_samples = Option(
        int, None, "HDBSCAN min_samples (default: datapoints clustered / 15, rounded, at least 1).", minimum=1
    )
    cluster_selection = Option(str, "eom", "HDBSCAN cluster_selection_method.", choices=("eom", "leaf"))
    allow_single_cluster = Option(bool, False, "HDBSCAN allow_single_cluster: one cluster of everything may be found.")
    filter = Option(bool, True, "polca and lca: the paper's filters (decreasing basis vectors and datapoints).")
    delta = Option(float, 100.0, "Δ of the breakthrough time, in training steps.", minimum=0)
    tau = Option(float, 1000.0, "τ of the hidden-breakthrough flag, in training steps.", minimum=0)
    label = Option(str, None, "Data label to score the clusters against (e.g. carry): homogeneity, recall, F1.")
    place_restrict = Option(bool, False, "Rank only clusters whose label tokens are mostly in --places (the paper).")
    place_label = Option(str, "place", "Label giving each token's place, for --place-restrict.")
    places = Option(str, "1,2", "Allowed --place-label values for --place-restrict (addition: 1=100s, 2=10s).")
    place_fraction = Option(
        float, 0.85, "Least fraction of a cluster's label tokens in --places (the paper: 0.85).", minimum=0, maximum=1
    )
    spacy_model = Option(
        str, "en_core_web_sm", "Splits with text: spaCy pipeline of the text labels (package, saved path, or none)."
    )
    pos_window = Option(
        int, 2, "Text labels: POS tags per sequence (the target token's and those before it).", minimum=1
    )
    text_top = Option(int, 5, "Text labels: tokens, POS sequences and medoid contexts listed per cluster.", minimum=1)

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.requires = (self.on, "loss") if self.on in ("fisher", "lca") else (self._source,)
        if not self.delta > 0:  # the bounds of the options say >= 0; Δ = 0 has no breakthrough either
            msg = f"--delta must be a positive number of steps, got {self.delta}"
            raise AnalysisError(msg)
        if self.place_restrict and not self.label:
            raise AnalysisError("--place-restrict needs --label (e.g. --label carry)")
        self._places = self._parse_places(self.places)

    @property
    def _source(self) -> str:
        """The analyzer whose result holds the trajectories."""
        return "loss" if self.on == "loss-change" else self.on

    @staticmethod
    def _parse_places(text: str) -> tuple[int, ...]:
        try:
            return tuple(int(part) for part in str(text).replace(" ", "").split(",") if part)
        except ValueError:
            msg = f"--places must be comma-separated integers, got {text!r}"
            raise AnalysisError(msg) from None

    def preflight(self, store: Any) -> None:
        """The label and the spaCy pipeline, before POLCA or Fisher are computed for nothing."""
        from ckpt.engine.pipeline import stored_provenance  # the engine (and dask) only when an analysis runs

        stored = stored_provenance(store, self._source) or {}
        split = (stored.get("options") or {}).get("split") or self.split or "eval"
        if split not in store.splits:
            return  # the analyzer clustered reports a missing split in its own words
        data = store.data(split)
        self._check_labels(data, split)
        if self.spacy_model != text_labels.NO_MODEL and text_labels.has_text(data):
            text_labels.check_pipeline(self.spacy_model)

    def _check_labels(self, data: xr.Dataset, split: str) -> None:
        known = data.attrs.get("labels", [])
        wanted = ([self.label] if self.label else []) + ([self.place_label] if self.place_restrict else [])
        for name in wanted:
            if name not in known:
                msg = f"split {split!r} has no label {name!r}; its labels are: {', '.join(known) or '(none)'}"
                raise AnalysisError(msg)

    def dependency_options(self) -> dict[str, dict[str, Any] | None]:
        """The stored options of each dependency (None), or just ``--split`` when it is given."""
        return {name: None if self.split is None else {"split": self.split} for name in self.requires}

    def compute(self, ctx: AnalysisContext) -> xr.Dataset:
        """One Dask task per basis vector (filter, HDBSCAN, statistics), lazily."""
        import dask
        import dask.array as da
        import xarray as xr

        source = ctx.result(self._source)
        options = source.ckpt.options
        split = options.get("split") or self.split or "eval"
        example, position = datapoint_index(ctx.store, split, options.get("objective"))
        variable = source[_TRAJECTORY[self.on]]
        if variable.sizes.get("datapoint") != len(example):
            found = variable.sizes.get("datapoint")
            msg = f"the {self._source} result has {found} datapoints; split {split!r} has {len(example)}"
            raise AnalysisError(msg)
        if self.on == "lca":
            variable = variable.rename(parameter="basis")
        if "basis" not in variable.dims:
            variable = variable.expand_dims("basis", axis=1)
        variable = variable.transpose("step", "basis", "datapoint")
        stored_steps = np.asarray(variable["step"].values, dtype=np.int64)  # an index: loaded, no compute
        if len(stored_steps) < 1:
            msg = f"{self._source} result has too few steps to cluster ({len(stored_steps)})"
            raise AnalysisError(msg)
        origin = self.on in _ALLOCATIONS
        if origin:  # eq. 10 at every checkpoint: θ_0, then the checkpoint that ends each transition
            steps = np.append(stored_steps, ctx.next_step(int(stored_steps[-1])))
        else:
            steps = stored_steps[:-1] if self.on == "loss-change" else stored_steps
        if len(steps) < 1:
            msg = f"{self._source} result has too few steps to cluster ({len(stored_steps)})"
            raise AnalysisError(msg)
        aggregate = self._aggregate(ctx, source, split, steps)
        aggregate_step = dask.delayed(aggregate_breakthrough, pure=True)(aggregate.data, steps=steps, delta=self.delta)
        count, bases = len(example), variable.sizes["basis"]
        slots = tr.max_clusters(count, self.min_cluster_size)
        labels = self._labels(ctx, split, example, position)
        settings = {
            "steps": steps,
            "cumulative": self.on == "lca",
            "difference": self.on == "loss-change",
            "origin": origin,
            "apply_filter": self.filter and origin,
            "slots": slots,
            "min_cluster_size": self.min_cluster_size,
            "min_samples": self.min_samples,
            "selection": self.cluster_selection,
            "allow_single_cluster": self.allow_single_cluster,
            "delta": self.delta,
            "tau": self.tau,
            **labels,
        }
        outputs = self._outputs(count, slots, len(steps), labels["place_kinds"])
        columns: dict[str, list[Any]] = {name: [] for name in outputs}
        per_basis = []
        for b in range(bases):
            task = dask.delayed(cluster_basis, pure=True)(variable.isel(basis=b).data, aggregate_step, **settings)
            per_basis.append((variable.isel(basis=b).data, task))
            for name, (_, dtype, shape) in outputs.items():
                columns[name].append(da.from_delayed(task[name], shape=shape, dtype=dtype))
        variables = {name: (("basis", *outputs[name][0]), da.stack(column)) for name, column in columns.items()}
        prepare = functools.partial(
            prepared, cumulative=settings["cumulative"], difference=settings["difference"], origin=origin
        )
        text, text_coords = text_labels.text_variables(
            ctx.store.data(split),
            example,
            position,
            per_basis,
            model=self.spacy_model,
            window=self.pos_window,
            top=self.text_top,
            prepare=prepare,
            slots=slots,
        )
        variables.update(text)
        variables["mean_trajectory"] = (("step",), aggregate.data)
        variables["mean_breakthrough_step"] = ((), da.from_delayed(aggregate_step, shape=(), dtype=np.float64))
        coords: dict[str, Any] = {
            "step": ("step", steps),
            "basis": ("basis", np.arange(bases)),
            "cluster": ("cluster", np.arange(slots)),
            "example": ("datapoint", example),
            "position": ("datapoint", position),
        }
        for name in _BASIS_COORDS:
            if name in variable.coords and set(variable[name].dims) == {"basis"}:
                coords[name] = variable[name].variable
        if labels["place_kinds"]:
            coords["place"] = ("place", np.asarray(labels["place_kinds"], dtype=np.int64))
        if self.label:
            place = variables.get("place_fraction") if self.place_restrict else None
            variables.update(self._ranking(variables["homogeneity"][1], place))
            coords["rank"] = ("rank", np.arange(3))
        result = xr.Dataset(variables, coords={**coords, **text_coords})
        self._describe(result, slots)
        return result

    def _aggregate(self, ctx: AnalysisContext, source: xr.Dataset, split: str, steps: np.ndarray) -> xr.DataArray:
        """The whole dataset's mean-loss curve on the trajectories' steps (lazy)."""
        if self.on == "loss":
            return source["loss"].mean("datapoint")
        if self.on == "loss-change":
            return source["loss"].mean("datapoint").diff("step", label="lower")
        if self.on == "polca":  # the mean loss relative to θ_0 at every checkpoint: 0, then after each transition
            import dask.array as da
            import xarray as xr

            after = source["loss_change"].mean("datapoint").cumsum("step").data
            return xr.DataArray(
                da.concatenate([da.zeros(1, dtype=after.dtype), after]), dims="step", coords={"step": steps}
            )
        loss = ctx.result("loss")
        loss_split = loss.ckpt.option("split")
        if loss_split != split:
            msg = (
                f"the stored loss is on split {loss_split!r} and {self.on} on {split!r}; "
                f"pass --split {split} to compute both on one split"
            )
            raise AnalysisError(msg)
        loss_steps = np.asarray(loss["step"].values, dtype=np.int64)
        wanted = steps  # fisher and lca (over the checkpoints): the mean loss at each checkpoint
        missing = sorted(set(wanted.tolist()) - set(loss_steps.tolist()))
        if missing:
            msg = f"the stored loss lacks a step the {self.on} result needs; rerun it (ckpt analyze loss --force)"
            raise AnalysisError(msg)
        mean = loss["loss"].mean("datapoint").sel(step=wanted)
        return mean.assign_coords(step=steps)

    def _labels(self, ctx: AnalysisContext, split: str, example: np.ndarray, position: np.ndarray) -> dict[str, Any]:
        """The label (and place) of every datapoint, read from the data split (no Dask)."""
        data = ctx.store.data(split)
        self._check_labels(data, split)
        known = data.attrs.get("labels", [])
        found: dict[str, Any] = {
            "label_values": None,
            "binary": False,
            "place_values": None,
            "place_kinds": (),
            "places": self._places,
        }
        try:
            if self.label:
                found["label_values"] = tr.datapoint_labels(data[self.label].values, example, position)
                found["binary"] = tr.is_binary(found["label_values"])
            # every cluster's make-up by the place label, whenever the split has one
            if self.place_label in known:
                found["place_values"] = tr.datapoint_labels(data[self.place_label].values, example, position)
                found["place_kinds"] = tuple(int(v) for v in np.unique(found["place_values"]))
        except ValueError as exc:
            raise AnalysisError(f"label {self.label or self.place_label!r}: {exc}") from None
        return found

    def _outputs(
        self, count: int, slots: int, steps: int, place_kinds: tuple[int, ...] = ()
    ) -> dict[str, tuple[tuple[str, ...], Any, tuple[int, ...]]]:
        """Each per-basis output: (dims after basis, dtype, shape)."""
        per_cluster = (("cluster",), (slots,))
        trajectory = (("cluster", "step"), (slots, steps))
        outputs: dict[str, tuple[tuple[str, ...], Any, tuple[int, ...]]] = {
            "cluster_label": (("datapoint",), np.int64, (count,)),
            "filtered": (("datapoint",), np.bool_, (count,)),
            "basis_kept": ((), np.bool_, ()),
            "clusters": ((), np.int64, ()),
            "size": (per_cluster[0], np.int64, per_cluster[1]),
            "medoid": (per_cluster[0], np.int64, per_cluster[1]),
            "median": (trajectory[0], np.float64, trajectory[1]),
            "lower_quartile": (trajectory[0], np.float64, trajectory[1]),
            "upper_quartile": (trajectory[0], np.float64, trajectory[1]),
            "breakthrough_step": (per_cluster[0], np.float64, per_cluster[1]),
            "breakthrough_score": (per_cluster[0], np.float64, per_cluster[1]),
            "hidden": (per_cluster[0], np.bool_, per_cluster[1]),
        }
        if place_kinds:
            outputs["place_share"] = (("cluster", "place"), np.float64, (slots, len(place_kinds)))
        if self.label:
            for name, dtype in (("label_value", np.int64), ("homogeneity", np.float64), ("recall", np.float64)):
                outputs[name] = (per_cluster[0], dtype, per_cluster[1])
            outputs["f1"] = (per_cluster[0], np.float64, per_cluster[1])
            if place_kinds:  # for --place-restrict, and for anyone ranking both ways
                outputs["place_fraction"] = (per_cluster[0], np.float64, per_cluster[1])
        return outputs

    def _ranking(self, homogeneity: Any, place: tuple[tuple[str, ...], Any] | None) -> dict[str, Any]:
        """The lazy top-3 homogeneities (restricted by the place fraction with --place-restrict)."""
        import dask
        import dask.array as da

        allowed = None if place is None else place[1] >= self.place_fraction  # NaN compares False
        task = dask.delayed(top_ranked, pure=True)(homogeneity, allowed)
        return {
            name: (("rank",), da.from_delayed(task[name], shape=(3,), dtype=dtype))
            for name, dtype in (("top_homogeneity", np.float64), ("top_basis", np.int64), ("top_cluster", np.int64))
        }

    def _describe(self, result: xr.Dataset, slots: int) -> None:
        k, shift = tr.delta_checkpoints(result["step"].values, self.delta)
        text = {
            "cluster_label": "HDBSCAN cluster of each datapoint per basis vector; -1: outlier or filtered",
            "filtered": "dropped by the POLCA filters (projected loss ends above 0) or non-finite, before clustering",
            "basis_kept": "basis vector kept by the POLCA filter (mean projected loss ends below 0, eq. 10)",
            "clusters": "number of clusters found",
            "size": f"datapoints in the cluster; -1: unused slot (the cluster axis holds {slots} slots)",
            "medoid": "datapoint index minimizing the summed Euclidean distance to the cluster",
            "median": "median trajectory of the cluster",
            "lower_quartile": "25th percentile trajectory of the cluster",
            "upper_quartile": "75th percentile trajectory of the cluster",
            "breakthrough_step": "argmax_t [f(t+D) - f(t)] - [f(t) - f(t-D)] of the median trajectory f",
            "breakthrough_score": "that score at the breakthrough step",
            "hidden": "breakthrough more than tau steps from the mean-loss breakthrough",
            "mean_trajectory": "the whole dataset's mean loss on the trajectories' steps (polca: relative to step 0)",
            "mean_breakthrough_step": "breakthrough step of mean_trajectory",
            "label_value": "label value scored: 1 for 0/1 labels, else the cluster's majority value",
            "homogeneity": "fraction of the cluster with label_value",
            "recall": "fraction of the dataset's datapoints with label_value that are in the cluster",
            "f1": "harmonic mean of homogeneity and recall",
            "place_fraction": "fraction of the cluster's label_value datapoints in the allowed places",
            "place_share": "fraction of the cluster's datapoints at each value of --place-label (its make-up)",
            "top_homogeneity": "three highest homogeneities over all basis vectors and clusters",
            "top_basis": "basis vector of each top homogeneity",
            "top_cluster": "cluster of each top homogeneity",
        }
        for name, description in text.items():
            if name in result:
                result[name].attrs["description"] = description
        result["breakthrough_step"].attrs["delta_checkpoints"] = k
        if np.isfinite(shift):
            result["breakthrough_step"].attrs["delta_steps"] = float(shift)

    def plot(self, result: xr.Dataset, store: Any) -> dict[str, Figure]:
        """``overview`` and one ``basis-B`` figure per basis vector with clusters (the paper's Fig. 4)."""
        from ckpt.analyzers.figures.clusters import figures

        return figures(result, store)

    def plot_together(self, results: dict[str, xr.Dataset], store: Any) -> dict[str, Figure]:
        """``homogeneity``: the best clusters' label homogeneities of each result side by side (Table 3)."""
        from ckpt.analyzers.figures.clusters import compare

        return compare(results)

    def summarize(self, result: xr.Dataset) -> str:
        """Per basis vector, each cluster's size, label make-up and breakthrough; then the top homogeneities."""
        options = result.ckpt.options
        result = result.load()
        steps = result["step"].values
        shift = result["breakthrough_step"].attrs.get("delta_steps")
        label = options.get("label")
        mean_step = float(result["mean_breakthrough_step"])
        lines = [
            f"  on {options.get('on')}: {result.sizes['datapoint']} datapoints, {result.sizes['basis']} basis "
            f"vector(s), {len(steps)} steps; min_cluster_size {options.get('min_cluster_size')}",
            f"  mean-loss breakthrough at step {_step_text(mean_step)}; Δ' = {_step_text(shift)} steps, "
            f"τ = {options.get('tau')}",
        ]
        header = f"    {'cluster':>7} {'size':>7} {'breakthrough':>12} {'hidden':>6}"
        if label:
            header += f"  {label:>8} {'homog.':>7} {'recall':>7} {'F1':>6}"
        if "place_share" in result:
            kinds = "/".join(str(int(k)) for k in result["place"].values)
            header += f"  {options.get('place_label', 'place')} {kinds} (%)"
        for b in range(result.sizes["basis"]):
            found = int(result["clusters"].values[b])
            noise = int(((result["cluster_label"].values[b] < 0) & ~result["filtered"].values[b]).sum())
            filtered = int(result["filtered"].values[b].sum())
            kept = "" if bool(result["basis_kept"].values[b]) else " (dropped by the filter)"
            lines.append(f"  basis {b}{kept}: {found} cluster(s), {noise} outliers, {filtered} filtered")
            if not found:
                continue
            lines.append(header)
            for c in range(found):
                row = (
                    f"    {c:>7} {int(result['size'].values[b, c]):>7} "
                    f"{_step_text(result['breakthrough_step'].values[b, c]):>12} "
                    f"{'yes' if result['hidden'].values[b, c] else 'no':>6}"
                )
                if label:
                    row += (
                        f"  {int(result['label_value'].values[b, c]):>8} {result['homogeneity'].values[b, c]:>7.3f} "
                        f"{result['recall'].values[b, c]:>7.3f} {result['f1'].values[b, c]:>6.3f}"
                    )
                if "place_share" in result:
                    row += "  " + "/".join(f"{100 * v:.0f}" for v in result["place_share"].values[b, c])
                lines.append(row)
                lines += text_labels.summary_lines(result, b, c)
        if label:
            restricted = " (place-restricted)" if options.get("place_restrict") else ""
            lines.append(f"  top homogeneities of {label!r}{restricted}:")
            for r in range(result.sizes["rank"]):
                value = float(result["top_homogeneity"].values[r])
                if np.isfinite(value):
                    b, c = int(result["top_basis"].values[r]), int(result["top_cluster"].values[r])
                    lines.append(f"    {r + 1}. {value:.3f}  basis {b} cluster {c}")
                else:
                    lines.append(f"    {r + 1}. -")
        return "\n".join(lines)


def _step_text(value: Any) -> str:
    value = float(value) if value is not None else float("nan")
    if not np.isfinite(value):
        return "-"
    return f"{value:g}"


ckpt_register_analyzers = analyzer_hook(Clusters)


__all__ = [
    "SOURCES",
    "Clusters",
    "aggregate_breakthrough",
    "ckpt_register_analyzers",
    "cluster_basis",
    "prepared",
    "top_ranked",
]
