"""Comments say why: no library comment or docstring quotes a timing, a machine, a date or a path outside the repo.

Measurements go stale silently, so they live in one place, ``docs/performance.md``, dated and
machine-named; code names that page's section when a figure justified a choice (STYLE.md, "Comments
state a contract or a reason in a line"). This test reads every comment (``tokenize``) and every
string statement (``ast``: module, class and function docstrings and attribute docstrings) of the
packages ``pyproject.toml`` installs, and fails on each line matching one of ``PATTERNS``.

Each pattern is written to miss what is legitimate text: a unit in a design value or an option's
help ("``--max-memory 4GiB``", "1 MiB blocks", "in seconds"), dtypes ("float64"), format and
version numbers, shapes ("100 x 30"), digit places ("the 10s digit"). The exceptions are in the
patterns themselves, each with its reason; there is no list of exempted lines.

The pointers themselves are checked too: every ``docs/X.md, "Section"`` (or ``§4.3.1``) that library
code or ``pyproject.toml`` cites names a heading (or a paragraph's bold lead) of that page, so that a
renamed section leaves no dangling pointer.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)[a-z]*\.?"
_NUM = r"\d+(?:[.,]\d+)?"
_RANGE = rf"{_NUM}(?:\s*(?:-|–|to)\s*{_NUM})?"
_BYTES = r"(?:[KMGT]i?B|bytes)"

PATTERNS: dict[str, re.Pattern[str]] = {
    # ISO dates and months, month-year dates: "2026-11-28", "until 2026-11", "Nov 2026", "28 Nov 2026"
    "date": re.compile(
        rf"\b20\d\d-[01]\d(?:-[0-3]\d)?\b|\b{_MONTH}\s+(?:[0-3]?\d,?\s+)?20\d\d\b|\b[0-3]?\d\s+{_MONTH}\s+20\d\d\b"
    ),
    # a duration with a unit: "58 ms", "0.3ms", "2.3 s", "17 min", "~2 us". A bare "s" needs a
    # space or a decimal ("2.3s") so that digit places ("the 10s and 100s") are not durations, and
    # "second" is an ordinal ("42 second passes"). Exception: a design interval or limit ("50 ms
    # apart", "every 10 s", "a timeout of 30 s", "up to 5 s") states a contract, not a measurement.
    "duration": re.compile(
        rf"(?<!every )(?<!up to )(?<!at most )(?<!timeout of )(?<!within )"
        rf"~?\b{_RANGE}\s*(?:ms|us|µs|ns|secs?|seconds|mins?|minutes?|hours?)\b(?!\s+apart)"
        rf"|(?<!every )(?<!up to )(?<!at most )(?<!timeout of )(?<!within )~?\b{_RANGE}\s+s\b(?!['’-]|\s+apart)"
        rf"|\b\d+\.\d+s\b|\btook\s+(?:about\s+|~)?(?:a|an|half an?)\s+(?:minute|second|hour)\b"
    ),
    # a speed-up or a rate: "3.1x", "40x", "3x cheaper", "3 times faster", "30% slower", "16 GB/s".
    # A ratio in words ("several times slower") says which way a choice went, not a figure, and passes.
    # "\d+x" followed by a digit or a letter is a shape or a hex literal ("128x128", "0x1f"); followed
    # by "smaller" or "larger" it is a design scale ("embeddings 0.1x smaller", "a 10x larger model").
    "speed-up": re.compile(
        rf"\b{_NUM}x(?![\w.])(?!\s+(?:smaller|larger|wider|narrower|bigger)\b)"
        rf"|\b{_NUM}\s*(?:x|times)\s+(?:faster|slower|cheaper|dearer|quicker|as fast)\b"
        rf"|\d\s*%\s+(?:faster|slower|cheaper|quicker)\b|\b{_NUM}\s*{_BYTES}/s\b|\b(?:it|steps?|tokens?)/s\b"
        r"|\bcosts?\s+(?:~|about\s+)?\d+(?:\.\d+)?\s*%"
    ),
    # a machine: "16-core", "2 cores", "H200", "on a GPU machine", "this VM", "a quiet machine",
    # "its 2 MiB L2 cache". "On one machine" / "on this machine" is where a run executes (a budget's
    # scope, as in ``--max-memory``), not a description of one, and passes; so does "noqa: A002".
    "machine": re.compile(
        r"\b\d+[- ](?:CPU[- ])?cores?\b|\b(?:[AHP]100|H200|A10G?|A40|A6000|V100|L40S?|T4|K80|RTX\s?\d{3,4})\b"
        r"|\b(?:EPYC|Xeon|Ryzen|Apple M\d)\b|\b\d+\s*[KM]i?B\s+L[123]\b"
        r"|\bthis\s+(?:\d+-core\s+)?(?:VM|CPU|GPU|box|laptop)\b|\b(?:GPU|CPU|quiet|busy|same)\s+machine\b"
        r"|\b(?:this|that)\s+machine's\b|\b\d+\s*[GT]i?B\s+(?:machine|VM|GPU)\b"
    ),
    # memory stated as measured: "held 77 GB", "peaked at 7.6 GB", "RSS 3 GB", "7.66 against 7.60 GB".
    # A size alone is a design size ("1 MiB blocks", "--max-memory 4GiB") and passes.
    "memory": re.compile(
        rf"\b(?:held|holds|took|peaked|peak(?:\s+of|\s+was)?|reached|grew(?:\s+to)?|used|RSS(?:\s+of)?|resident)"
        rf"\s+(?:at\s+|about\s+|~)?{_RANGE}\s*{_BYTES}\b"
        rf"|\b{_NUM}\s*(?:{_BYTES}\s+)?(?:against|instead of)\s+{_NUM}\s*{_BYTES}\b"
        rf"|\b{_NUM}\s*{_BYTES}\s+(?:RSS|against|instead of)\b"
        rf"|\b{_RANGE}\s*[MK]?\s+(?:page\s+)?faults\b"
    ),
    # how a figure was measured: "medians of 7", "3 trials", "alternated runs", "interleaved"
    "method": re.compile(
        r"\bmedians?\s+of\s+\d+|\b\d+\s+(?:trials|fresh processes|alternated runs|interleaved runs)\b"
        r"|\b(?:alternated|interleaved),?\s+(?:in\s+one\s+process|runs?)\b"
    ),
    # a path outside the repository: "/work/...", "/tmp/...", "../shared/GPU.md"
    "outside path": re.compile(r"(?<![\w.])/(?:work|tmp|home|mnt|Users|root)\b|\.\./\w|\bshared/\w+\.md\b"),
}


def library_files() -> list[Path]:
    """Every ``.py`` file of the packages ``pyproject.toml`` installs (tests, bench, repro and docs are not)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    folders = {ROOT / folder for folder in config["tool"]["setuptools"]["package-dir"].values()}
    return sorted(path for folder in folders for path in folder.rglob("*.py"))


def prose_lines(source: str) -> list[tuple[int, str]]:
    """``(line, text)`` of every comment and of every line of every string statement in ``source``."""
    lines = source.splitlines()
    found = [
        (token.start[0], token.string)
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            found += [(n, lines[n - 1]) for n in range(node.lineno, (node.end_lineno or node.lineno) + 1)]
    return sorted(found)


def offenders() -> list[str]:
    """``file:line: [pattern] text`` for each library line quoting a measurement, a machine, a date or a path."""
    found = []
    for path in library_files():
        for number, text in prose_lines(path.read_text()):
            names = [name for name, pattern in PATTERNS.items() if pattern.search(text)]
            if names:
                found.append(f"{path.relative_to(ROOT)}:{number}: [{', '.join(names)}] {text.strip()}")
    return found


def test_the_scan_covers_every_package() -> None:
    folders = {path.relative_to(ROOT).parts[0] for path in library_files()}
    assert {"ckpt", "ckptstore", "plugins", "analyzers", "cli", "sandboxes"} <= folders


def test_library_comments_quote_no_timings_machines_dates_or_outside_paths() -> None:
    found = offenders()
    assert not found, (
        f"{len(found)} comment or docstring lines quote a measurement, a machine, a date or a path "
        "outside the repository; keep the why in a sentence and name the docs/performance.md section:\n"
        + "\n".join(found)
    )


FLAGGED = [
    "58 ms per checkpoint with it, 28 ms without",
    "on a 16-core GPU machine",
    "until 2026-11-28",
    "deprecated since Nov 2026",
    "the whole process took 2.3 s",
    "0.3ms per tensor",
    "2.3s a product",
    "the suite took 17 min",
    "3.1x faster",
    "cut the products 40x",
    "3x cheaper",
    "2 times faster",
    "about 16 GB/s",
    "an H200",
    "an A100",
    "this VM",
    "on this 2-core machine",
    "40 s on 2 cores",
    "the run held 77 GB",
    "peaked at 7.6 GB",
    "7.66 against 7.60 GB",
    "14.6-14.8M page faults",
    "medians of 7 fresh processes",
    "(H100, ../shared/GPU.md's run)",
    "(/tmp benchmark)",
    "see /work/shared/notes.md",
    "stays in this machine's 2 MiB L2 cache",
    "measured on a quiet machine",
    "the 2-core AMD EPYC",
    "the ARPACK criterion this module kept until 2026-11",
    "on a 24 GiB machine",
    "peaked there, at 10.98 GiB RSS",
    "held once, at 10.44 GiB against a plan of 10.9 GiB",
    "its passes took about a minute",
    "a folder per step cost ~40% of a write",
]
PASSED = [
    "--max-memory 4GiB",
    "the limit, in seconds",
    "float64 throughout",
    "1 MiB blocks",
    "format_version 2, ckpt 0.2",
    "a store of 100 x 30 tensors",
    "shape 128x128, mask 0x1f",
    "the 1000s, 100s, 10s and 1s digit",
    "2 ** 20 bytes",
    "O(D) memory",
    "one thread per core",
    "a GPU run",
    "docs/performance.md, 'Lanczos threads'",
    "threshold 1e-6",
    "several times slower",
    "# noqa: A002",
    "non-blocking tries, 50 ms apart",
    "a timeout of 30 s",
    "42 second passes",
    "bytes this run may use on one machine",
    "embeddings 0.1x smaller",
    "MKL_CBWR=AVX2 pins the kernels",
]


def test_the_patterns_flag_measurements() -> None:
    missed = [text for text in FLAGGED if not any(pattern.search(text) for pattern in PATTERNS.values())]
    assert not missed


def test_the_patterns_pass_legitimate_text() -> None:
    flagged = {text: [n for n, p in PATTERNS.items() if p.search(text)] for text in PASSED}
    assert not {text: names for text, names in flagged.items() if names}


# A pointer into a doc page: ``docs/X.md, "Section"``, ``docs/X.md, 'Section'``, ``docs/X.md ("Section")``
# (the quote closes with the one that opened it, so a name may hold the other), or by number:
# ``docs/X.md §4.3.1``, ``docs/X.md section 1.4``; the path may be in backticks. Whitespace is
# collapsed first, so a name may wrap.
CITATION = re.compile(
    r"\bdocs/(?P<page>[\w./-]+?\.md)`*(?:,\s*|\s*\(\s*)(?P<quote>[\"'])(?P<name>[^\"'\n]+?)(?P=quote)"
    r"|\bdocs/(?P<npage>[\w./-]+?\.md)`*,?\s*(?:§\s*|section\s+)(?P<number>\d+(?:\.\d+)*)"
)
HEADING = re.compile(r"^#{1,6}\s+(?P<text>.+?)\s*#*\s*$")
# A paragraph's bold lead is a section too ("**Trust.** A store is data"), not a bullet's.
BOLD_LEAD = re.compile(r"^\*\*(?P<text>[^*]+?)[.:]?\*\*")
SECTION_NUMBER = re.compile(r"^(?P<number>\d+(?:\.\d+)*)\.?\s+")


def prose_fragments(path: Path) -> list[str]:
    """The texts of ``path`` a citation can sit in, whitespace collapsed.

    A ``.py`` file gives its comments (all of them, one text, so a citation may wrap onto the next comment
    line) and each string constant (docstrings and messages; ``ast`` joins implicitly concatenated parts,
    f-strings' literal parts included). Any other file gives its whole text, comment markers removed.
    """
    source = path.read_text()
    if path.suffix != ".py":
        return [" ".join(" ".join(re.sub(r"^\s*#+", "", line) for line in source.splitlines()).split())]
    comments = " ".join(
        token.string.lstrip("#")
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    )
    strings = [
        node.value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]
    return [" ".join(text.split()) for text in [comments, *strings]]


def citations(texts: list[str]) -> list[tuple[str, str]]:
    """``(page, section)`` for each pointer in ``texts``; a numbered section is given as ``§4.3.1``."""
    found = []
    for text in texts:
        for match in CITATION.finditer(text):
            if match["page"]:
                found.append((match["page"], match["name"].strip()))
            else:
                found.append((match["npage"], "§" + match["number"]))
    return found


def section_names(markdown: str) -> set[str]:
    """The names a pointer may use for the sections of ``markdown``.

    A heading's text (backticks dropped), that text without its leading number ("4.4 One writer at a time"
    answers "One writer at a time"), its title before a colon ("Validation: what a reader checks" answers
    "Validation"), its number as ``§4.4``; and each paragraph's bold lead.
    """
    names: set[str] = set()
    in_code = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        if heading := HEADING.match(line):
            text = heading["text"].replace("`", "")
            names.add(text)
            if number := SECTION_NUMBER.match(text):
                names.add("§" + number["number"])
                text = text[number.end() :]
                names.add(text)
            names.add(text.split(":")[0].strip())
        elif lead := BOLD_LEAD.match(line):
            names.add(lead["text"].replace("`", ""))
    return names


def dangling(cited: list[tuple[str, str, str]], pages: dict[str, str | None]) -> list[str]:
    """``where: docs/page, "section"`` for each citation ``(where, page, section)`` naming no section.

    ``pages`` maps a page to its text (None: the page does not exist).
    """
    names = {page: section_names(text) for page, text in pages.items() if text is not None}
    return [
        f'{where}: docs/{page}, "{section}"' + ("" if page in names else " (no such page)")
        for where, page, section in cited
        if section not in names.get(page, set())
    ]


def library_citations() -> list[tuple[str, str, str]]:
    """``(file, page, section)`` for every pointer into docs/ from library code and pyproject.toml."""
    found = []
    for path in [*library_files(), ROOT / "pyproject.toml"]:
        where = str(path.relative_to(ROOT))
        found += [(where, page, section) for page, section in citations(prose_fragments(path))]
    return found


def test_every_section_library_code_cites_exists() -> None:
    cited = library_citations()
    assert any(page == "performance.md" for _, page, _ in cited), "the scan found no pointer at all"
    pages = {
        page: (ROOT / "docs" / page).read_text() if (ROOT / "docs" / page).is_file() else None for _, page, _ in cited
    }
    missing = dangling(cited, pages)
    assert not missing, (
        f"{len(missing)} pointers from library code name a section their doc page lacks (a renamed or "
        "removed heading?); name an existing section or restore the heading:\n" + "\n".join(missing)
    )


def test_citation_forms_are_found_and_checked(tmp_path: Path) -> None:
    module = tmp_path / "cited.py"
    module.write_text(
        '"""Blocks of 4 MiB (docs/performance.md, "Lanczos\n    vectors")."""\n'
        "# the reader's limit (docs/store-format.md, 'One writer at a time'); see also\n"
        '# ``docs/analyzers.md`` ("What it costs") and docs/store-format.md §4.3.1\n'
        'MESSAGE = f"{1} kept (docs/existing-runs.md, " "\'Checking a trajectory\')"\n'
    )
    cited = [("cited.py", page, section) for page, section in citations(prose_fragments(module))]
    assert sorted(cited) == sorted(
        [
            ("cited.py", "performance.md", "Lanczos vectors"),
            ("cited.py", "store-format.md", "One writer at a time"),
            ("cited.py", "analyzers.md", "What it costs"),
            ("cited.py", "store-format.md", "§4.3.1"),
            ("cited.py", "existing-runs.md", "Checking a trajectory"),
        ]
    )
    pages: dict[str, str | None] = {
        "performance.md": "# Notes\n\n## Lanczos vectors\n",
        "store-format.md": "## 4. Commit protocol\n\n### 4.3.1 Atomic create\n\n### 4.4 One writer at a time\n",
        "analyzers.md": "## `polca`\n\n**What it costs.** Everything below.\n",
        "existing-runs.md": "## Checking a trajectory\n",
    }
    assert dangling(cited, pages) == []
    # a renamed heading, a heading only inside a code block, a bold word in a bullet, a missing page
    pages["performance.md"] = "# Notes\n\n## Lanczos vectors, spilled\n\n```\n## Lanczos vectors\n```\n"
    pages["analyzers.md"] = "## `polca`\n\n- **What it costs.** Everything below.\n"
    pages["existing-runs.md"] = None
    assert sorted(dangling(cited, pages)) == [
        'cited.py: docs/analyzers.md, "What it costs"',
        'cited.py: docs/existing-runs.md, "Checking a trajectory" (no such page)',
        'cited.py: docs/performance.md, "Lanczos vectors"',
    ]
