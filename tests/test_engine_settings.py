"""The engine settings are declared once, in :class:`ckpt.engine.settings.EngineSettings`.

Everything that names them is made from its fields: the reserved names of the plugin host
(``ENGINE_SETTINGS``), the options of ``ckpt analyze``, the signature and the docstring of
``ckpt.analyze``, and the list docs/plugins.md gives. Each test compares one of them with the fields.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

import ckpt
from ckpt.engine.settings import ENGINE_FIELDS, EngineSettings
from ckpt.errors import AnalysisError

ROOT = Path(__file__).resolve().parents[1]
NAMES = [f.name for f in dataclasses.fields(EngineSettings)]


def test_the_reserved_names_of_the_plugin_host_are_the_fields() -> None:
    from ckpt.plugins.analyzer import ENGINE_SETTINGS

    assert list(ENGINE_SETTINGS) == NAMES
    assert EngineSettings.names() == tuple(NAMES)


def test_the_options_of_ckpt_analyze_are_made_from_the_fields() -> None:
    from ckpt.cli.analyze import AnalyzeGroup, analyze

    command = AnalyzeGroup.get_command(analyze, click.Context(analyze), "loss")
    assert command is not None
    options = {p.name: p for p in command.params if isinstance(p, click.Option)}
    on_the_command_line = [f for f in ENGINE_FIELDS if f.metadata["cli"]]
    assert [f.name for f in on_the_command_line] == [n for n in options if n in NAMES]
    for setting in on_the_command_line:
        option = options[setting.name]
        assert option.help == setting.metadata["help"], setting.name
        assert option.default == setting.metadata["cli_default"], setting.name
    assert options["save_as"].opts == ["--as"]
    assert options["max_memory"].opts == ["--max-memory"]
    assert list(options["scheduler"].type.choices) == ["threads", "processes", "sync"]
    assert not options["force"].secondary_opts, "--force is a flag, with no --no-force"
    assert options["progress"].secondary_opts == ["--no-progress"]
    assert "registry" not in options and "storage_options" not in options, "objects have no option"


@pytest.mark.parametrize("function", [ckpt.analyze, ckpt.analyze_runs], ids=["analyze", "analyze_runs"])
def test_the_signature_and_the_docstring_of_ckpt_analyze_are_made_from_the_fields(function) -> None:
    parameters = inspect.signature(function).parameters
    keyword_only = [p for p in parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name != "lineage"]
    assert [p.name for p in keyword_only] == NAMES
    for parameter, setting in zip(keyword_only, ENGINE_FIELDS, strict=True):
        assert parameter.default == setting.default, setting.name
    assert list(parameters)[-1] == "options"
    doc = inspect.getdoc(function) or ""
    assert "{engine_settings}" not in doc
    for setting in ENGINE_FIELDS:
        entry = f"{setting.name} : {setting.metadata['kind']}, default {setting.default!r}"
        assert entry in doc, entry
        first_words = " ".join(setting.metadata["doc"].split()[:4])
        assert first_words in " ".join(doc.split()), setting.name


def test_the_plugin_guide_lists_the_fields() -> None:
    guide = (ROOT / "docs" / "plugins.md").read_text()
    listed = re.search(r"\(`ckpt\.plugins\.analyzer\.ENGINE_SETTINGS`: (.+?)\)", guide, flags=re.S)
    assert listed is not None
    assert re.findall(r"`(\w+)`", listed.group(1)) == NAMES


def test_the_engine_splits_its_settings_from_the_analyzer_options() -> None:
    settings, options = EngineSettings.split({"device": "cpu", "split": "eval", "force": True})
    assert (settings.device, settings.force, options) == ("cpu", True, {"split": "eval"})


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"scheduler": "gpu"}, "scheduler must be one of threads, processes, sync, got 'gpu'"),
        ({"address": "not an address"}, "--address must be a dask scheduler address"),
        ({"workers": 0}, "--workers must be a whole number of at least 1, got 0"),
        ({"block_steps": "4"}, "--block-steps must be a whole number of at least 1, got '4'"),
        ({"device": "tpu"}, "--device must be auto, cpu, cuda, cuda:N or mps, got 'tpu'"),
        ({"max_memory": "lots"}, "lots"),
    ],
)
def test_a_wrong_setting_is_one_error_naming_it(values: dict[str, object], words: str) -> None:
    with pytest.raises(AnalysisError, match=re.escape(words)):
        EngineSettings(**values).resolve()  # type: ignore[arg-type]


def test_resolved_settings_hold_the_budget_in_bytes_and_resolve_to_themselves() -> None:
    resolved = EngineSettings(max_memory="12GiB").resolve()
    assert resolved.max_memory == resolved.budget == 12 * 2**30
    assert resolved.resolve() == resolved
    assert EngineSettings().resolve().budget, "a share of what is free, measured once"
    assert EngineSettings(address="tcp://127.0.0.1:8786").resolve().budget is None, "each machine its own"


def test_settings_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        EngineSettings().device = "cuda"  # type: ignore[misc]


def test_resolving_ckpt_analyze_and_its_signature_imports_neither_dask_nor_xarray() -> None:
    code = (
        "import inspect, sys, ckpt; inspect.signature(ckpt.analyze); ckpt.analyze.__doc__; "
        "print(sorted({'dask', 'xarray', 'torch', 'zarr'} & set(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stderr
