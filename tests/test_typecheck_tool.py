"""tools/typecheck.py: the tree mypy reads mirrors pyproject's package folders, and its paths map back."""

import importlib.util
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_tool():
    spec = importlib.util.spec_from_file_location("typecheck", ROOT / "tools" / "typecheck.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tree_mirrors_package_dir(tmp_path):
    tool = load_tool()
    dirs = tool.package_dirs(tomllib.loads((ROOT / "pyproject.toml").read_text()))
    assert dirs["ckpt.store"] == "ckptstore"  # read from pyproject, not written in the tool
    tool.build_tree(dirs, tmp_path)
    for name, folder in dirs.items():
        here = tmp_path.joinpath(*name.split("."))
        assert (here / "__init__.py").resolve() == (ROOT / folder / "__init__.py").resolve(), name
    assert (tmp_path / "ckpt" / "errors.py").resolve() == ROOT / "ckpt" / "errors.py"


def test_paths_map_back_to_the_repository():
    tool = load_tool()
    prefixes = {"ckpt/store/": "ckptstore/", "ckpt/plugins/": "plugins/", "ckpt/": "ckpt/"}
    line = 'ckpt/store/reader.py:12: error: Item "None" of "X | None" [union-attr]'
    assert tool.rewrite(line, prefixes) == 'ckptstore/reader.py:12: error: Item "None" of "X | None" [union-attr]'
    note = "ckpt/plugins/_manager.py:3: note: in ckpt/store/writer.py and ckpt/errors.py"
    assert tool.rewrite(note, prefixes) == "plugins/_manager.py:3: note: in ckptstore/writer.py and ckpt/errors.py"
    assert tool.rewrite("see mylib/ckpt/store/x.py", prefixes) == "see mylib/ckpt/store/x.py"  # only whole paths
