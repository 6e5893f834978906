"""Docs are tested code: the CLI reference is current, the README's commands are CI's, examples run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

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
