"""Docs are tested code: the CLI reference is current, the README's commands are CI's, examples run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import ckpt.store as ckptstore

ROOT = Path(__file__).resolve().parents[1]


def test_cli_reference_is_generated_from_help() -> None:
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        import gen_cli
    finally:
        sys.path.pop(0)
    assert (ROOT / "docs" / "cli.md").read_text() == gen_cli.render(), "run: python docs/gen_cli.py"


def test_readme_test_command_is_what_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"```bash\n(.+?)\n```", readme, flags=re.S)
    assert len(commands) == 2, "the README has exactly two commands: try it, and run the tests"
    assert commands[1] in (ROOT / ".ci" / "run").read_text()


def test_quickstart_example_runs(tmp_path: Path) -> None:
    path = tmp_path / "quickstart.zarr"
    result = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "examples" / "quickstart.py"), str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "wrote 26 checkpoints (steps 0..400)" in result.stdout
    store = ckptstore.open(path)
    final = store.metrics.sel(step=400)
    assert float(final["accuracy"]) > 0.95, "the quickstart model should learn its task"
    assert store.data("eval").attrs["labels"] == ["upper_half"]


def test_store_format_doc_names_every_constant() -> None:
    from ckpt.store import format as fmt

    doc = (ROOT / "docs" / "store-format.md").read_text()
    for value in (fmt.FORMAT_NAME, *fmt.TOP_LEVEL_GROUPS, fmt.LOCKS, *fmt.DATA_VARIABLES, *fmt.ENCODED_DTYPES):
        assert value in doc, value
    assert f'"format_version": {fmt.FORMAT_VERSION}' in doc
    assert fmt.DIGESTS in doc
    assert f"### 2.1 Lineage: `{fmt.PARENT}`" in doc


def test_analyzer_reference_documents_every_builtin_analyzer_and_option() -> None:
    from ckpt.plugins import load_registry

    registry = load_registry(entry_points=False)
    doc = (ROOT / "docs" / "analyzers.md").read_text()
    for name, analyzer in registry.analyzers.items():
        assert f"## `{name}`" in doc, name
        for option in analyzer.option_spec():
            assert f"`--{option.replace('_', '-')}`" in doc, f"{name}: --{option}"


def test_plugin_guide_shows_the_example_plugin_verbatim() -> None:
    code = (ROOT / "docs" / "examples" / "ckpt-example-plugin" / "ckpt_weight_norm" / "__init__.py").read_text()
    assert code.strip() in (ROOT / "docs" / "plugins.md").read_text(), "docs/plugins.md must show the tested example"


def _plugin_guide() -> str:
    return (ROOT / "docs" / "plugins.md").read_text()


def test_plugin_guide_documents_every_public_name() -> None:
    import ckpt.plugins
    import ckpt.plugins.testing

    doc = _plugin_guide()
    for module in (ckpt.plugins, ckpt.plugins.testing):
        missing = [name for name in module.__all__ if f"`{name}" not in doc]
        assert not missing, f"docs/plugins.md does not mention {module.__name__}.{missing}"


def test_plugin_guide_lists_the_engine_settings_of_the_code() -> None:
    from ckpt.plugins.analyzer import ENGINE_SETTINGS

    listed = re.search(r"\(`ckpt\.plugins\.analyzer\.ENGINE_SETTINGS`: (.+?)\)", _plugin_guide(), flags=re.S)
    assert listed is not None
    assert re.findall(r"`(\w+)`", listed.group(1)) == list(ENGINE_SETTINGS)


def test_plugin_guide_lists_the_reserved_task_keywords_of_the_code() -> None:
    import inspect

    from ckpt.plugins import AnalysisContext

    own = []
    for method in (AnalysisContext.map_checkpoints, AnalysisContext.map_pairs):
        for parameter in inspect.signature(method).parameters.values():
            if parameter.kind is parameter.KEYWORD_ONLY and parameter.name not in own:
                own.append(parameter.name)
            assert parameter.kind is not parameter.POSITIONAL_OR_KEYWORD, f"{method.__name__}: {parameter.name}"
    listed = re.search(r"\(reserved: (.+?)\)", _plugin_guide(), flags=re.S)
    assert listed is not None
    assert sorted(re.findall(r"`(\w+)`", listed.group(1))) == sorted(own)


def _guide_function(name: str) -> Any:
    """The module-level function ``name`` that a code block of docs/plugins.md defines."""
    import numpy as np

    from ckpt.plugins import Worker

    block = next(b for b in re.findall(r"```python\n(.+?)```", _plugin_guide(), flags=re.S) if f"def {name}(" in b)
    namespace: dict[str, Any] = {"np": np, "Worker": Worker}
    exec(compile(block, f"docs/plugins.md:{name}", "exec"), namespace)
    return namespace[name]


def _reference_gradients(store: Path, step: int) -> Any:
    """Per-example gradients ``[N, D]`` (float64) of the example run's cross-entropy, by hand."""
    import torch
    import torch.nn.functional as F

    from ckpt.plugins.testing import mlp

    opened = ckptstore.open(store)
    model = mlp().double()
    model.load_state_dict({k: torch.from_numpy(v).double() for k, v in opened.tensors(step).items()})
    data = opened.data("eval")
    inputs, targets = torch.from_numpy(data["inputs"].values).double(), torch.from_numpy(data["targets"].values)
    rows = []
    for x, y in zip(inputs, targets, strict=True):
        model.zero_grad()
        F.cross_entropy(model(x[None]), y[None]).backward()
        rows.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    return torch.stack(rows)


def test_plugin_guide_task_functions_compute_what_they_say(tmp_path: Path) -> None:
    import numpy as np

    from ckpt.engine.worker import TaskSpec, worker_for
    from ckpt.plugins.testing import write_example_run

    store = write_example_run(tmp_path / "run.zarr", steps=2, examples=20)
    worker = worker_for(TaskSpec(str(store)))
    gradients = _reference_gradients(store, 1)
    norm = float(gradients.mean(0).norm())
    gradient_norm = _guide_function("gradient_norm")
    for dtype, rtol in (("float32", 1e-5), ("float64", 1e-12)):
        np.testing.assert_allclose(gradient_norm(worker, 1, split="eval", dtype=dtype)["grad_norm"], norm, rtol=rtol)
    mean = gradients.mean(0)
    expected = (gradients @ mean / (gradients.norm(dim=1) * mean.norm())).numpy()
    alignment = _guide_function("gradient_alignment")(worker, 1, split="eval", examples_per_block=7)
    np.testing.assert_allclose(alignment["cosine"], expected, rtol=1e-4, atol=1e-6)
    import pytest

    from ckpt.errors import AnalysisError

    params = dict(worker.params(1))
    params.pop("0.bias")
    with pytest.raises(AnalysisError, match=r"no tensor '0.bias'.*never a subset"):  # stand-ins would read as zeros
        worker.outputs(params, worker.data("eval")["inputs"])
