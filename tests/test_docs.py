"""The docs are reference: README.md and docs/results.md carry no history (issue, stop and
session numbers, earlier machines or rounds: those live in docs/notebook/); the README's picture
only shows figures docs/results.md records; the file table of docs/architecture.md matches the
tree, both ways, and its "How to add ..." names files, commands and code that exist."""
import fnmatch
import glob
import json
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# History markers. `#\d+` is an issue or PR reference, not a colour (#1f6fb4), an HTML entity
# (&#123;) or a URL fragment (page#3).
HISTORY = re.compile(
    r"\bissues?\s+#?\d+"
    r"|(?<![\w&#/])#\d+\b"
    r"|\bstops?\s+\d+\b"
    r"|\bsessions?\s+\d+\b"
    r"|\bthe round before\b"
    r"|\bearlier machines?\b",
    re.I)


def _read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


@pytest.mark.parametrize("text,found", [
    ("fixed in issue 19 (see #42)", ["issue 19", "#42"]),
    ("Issues 18 and 19", ["Issues 18"]),
    ("measured in stop 27, as the round before did", ["stop 27", "the round before"]),
    ("session 4 code, on the earlier machine", ["session 4", "earlier machine"]),
    ("a stop string (`--stop`), stop 2 times? no: stops tokens", ["stop 2"]),
])
def test_history_pattern_finds_history(text, found):
    assert HISTORY.findall(text) == found


@pytest.mark.parametrize("text", [
    "colour #1f6fb4, entity &#123;, link results.md#memory, page#3",
    "python -m mnn_h2o.bench   # ~40 min on 2 cores; # 1 is not a reference",
    "the store's issue queue, 30 stopped trials, a session object, the earlier rows of a plane",
    "[Memory](#memory) and [Short prompts](#short-prompts-eviction-starts-at-3072-tokens)",
    "before the question is seen; stops at 3072 tokens",
])
def test_history_pattern_spares_legitimate_text(text):
    assert HISTORY.findall(text) == []


@pytest.mark.parametrize("path", ["README.md", "docs/results.md"])
def test_reference_docs_carry_no_history(path):
    found = HISTORY.findall(_read(path))
    assert not found, f"{path} carries history (move it to docs/notebook/): {found}"


def test_other_docs_carry_no_issue_numbers():
    for path in glob.glob(os.path.join(ROOT, "docs", "*.md")):
        found = re.findall(r"\bissues?\s+#?\d+|\bstops?\s+\d+\b|\bsessions?\s+\d+\b", _read(path), re.I)
        assert not found, f"{os.path.relpath(path, ROOT)}: {found}"


# --- the README's picture -------------------------------------------------------------------

def test_readme_plot_figures_are_in_results():
    from mnn_h2o.tools import readme_plot

    data = readme_plot.load(readme_plot.DEFAULT_JSON)
    figs = readme_plot.figures(data)
    assert len(figs) >= 10
    assert readme_plot.check_figures(data, _read("docs/results.md")) == []
    engines = {p["engine"] for p in data["points"]}
    assert engines == {"ours", "llama.cpp"}
    for p in data["points"]:
        xy = readme_plot.point_xy(p)
        assert 0 < xy["mib"] < 200 and 0 <= xy["kl"] < 1, p["label"]


def test_readme_plot_check_catches_drift():
    """A figure changed in the JSON, a quote the section lacks, or a section that is gone, each
    fail the check."""
    from mnn_h2o.tools import readme_plot

    results = _read("docs/results.md")
    data = readme_plot.load(readme_plot.DEFAULT_JSON)
    kl = next(p for p in data["points"] if isinstance(p["kl"], list))["kl"][0]

    changed = json.loads(json.dumps(data))
    next(p for p in changed["points"] if isinstance(p["kl"], list))["kl"][0]["value"] = "0.0999"
    assert any("does not contain the value 0.0999" in e for e in readme_plot.check_figures(changed, results))

    assert readme_plot.check_figures(data, results.replace(kl["quote"], "")) != []

    moved = json.loads(json.dumps(data))
    next(p for p in moved["points"] if isinstance(p["kl"], list))["kl"][0]["section"] = "No such section"
    assert any("no section titled" in e for e in readme_plot.check_figures(moved, results))


def test_readme_plot_draws(tmp_path):
    pytest.importorskip("matplotlib")
    from mnn_h2o.tools import readme_plot

    out = tmp_path / "readme.png"
    assert readme_plot.main(["--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_readme_plot_refuses_a_bad_file(tmp_path, capsys):
    from mnn_h2o.tools import readme_plot

    bad = tmp_path / "plot.json"
    bad.write_text('{"points": [{"engine": "ours", "label": "x"}]}')
    assert readme_plot.main(["--json", str(bad), "--check"]) == 2
    assert "needs 'kl'" in capsys.readouterr().err


# --- the file table of docs/architecture.md -------------------------------------------------

def _file_rows():
    """(paths of the left column, backticked names of the right column) per row of the table."""
    text = _read("docs/architecture.md")
    start = text.index("## Files")
    table = text[start:text.index("\n## ", start + 1)]
    rows = []
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or cells[0] == "path" or set(cells[0]) <= set("-"):
            continue
        rows.append((re.findall(r"`([^`]+)`", cells[0]), re.findall(r"`([^`]+)`", cells[1])))
    assert rows
    return rows


def _matches(folder, name):
    pattern = os.path.join(ROOT, folder, name.rstrip("/"))
    return glob.glob(pattern) + glob.glob(pattern + ".*")


def test_file_table_names_exist():
    for paths, names in _file_rows():
        for p in paths:
            assert os.path.exists(os.path.join(ROOT, p)), f"docs/architecture.md names {p}, which is not in the tree"
        folders = [p for p in paths if os.path.isdir(os.path.join(ROOT, p))]
        for name in names:
            assert any(_matches(f, name) for f in folders), \
                f"docs/architecture.md Files: `{name}` is not in {', '.join(folders)} (backticks in the right column are file names)"


@pytest.mark.parametrize("folder", ["native/src/", "mnn_h2o/", "mnn_h2o/tools/", "docs/"])
def test_file_table_names_every_file(folder):
    names = [n.rstrip("/") for paths, ns in _file_rows() if folder in paths for n in ns]
    assert names, f"docs/architecture.md Files has no row for {folder}"
    for entry in sorted(os.listdir(os.path.join(ROOT, folder))):
        full = os.path.join(ROOT, folder, entry)
        if entry.startswith(("_", ".")) or entry.endswith(".so"):
            continue  # __init__.py, __pycache__, the developer build's _core*.so
        if os.path.isfile(full) and folder.startswith("mnn_h2o") and not entry.endswith(".py"):
            continue
        assert any(fnmatch.fnmatch(entry, n) or fnmatch.fnmatch(entry, n + ".*") for n in names), \
            f"{folder}{entry} is not named in docs/architecture.md's Files table"


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("path", ["README.md", "docs/results.md"])
def test_in_page_links_resolve(path):
    text = _read(path)
    anchors = {_slug(h) for h in re.findall(r"^#+ (.*)$", text, re.M)}
    for target in re.findall(r"\]\(#([^)]+)\)", text):
        assert target in anchors, f"{path} links #{target}, which no heading makes"


# --- docs/architecture.md "How to add ...": the files and names it sends a reader to ----------

_SOURCE_DIRS = ("mnn_h2o", "native", "bindings")


def _how_to_add_names():
    text = _read("docs/architecture.md")
    start = text.index("## How to add ...")
    end = text.find("\n## ", start + 1)
    return sorted(set(re.findall(r"`([^`]+)`", text[start:end if end > 0 else None])))


def _tree_files():
    files = []
    for top in _SOURCE_DIRS + ("docs", "tests", "scripts"):
        for folder, dirs, names in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [d for d in dirs if not d.startswith((".", "__"))]
            files += [os.path.join(folder, n) for n in names]
    return files


def test_how_to_add_names_real_files_commands_and_symbols():
    """Each backticked file exists (by its path, or by its name somewhere in the tree), each
    `python -m mnn_h2o.X` command is a module, and each code name (a class, function, constant,
    or Class.member) is written somewhere in the sources."""
    files = _tree_files()
    basenames = {os.path.basename(f) for f in files}
    source = "\n".join(_read(os.path.relpath(f, ROOT)) for f in files
                       if f.endswith((".py", ".cpp", ".h", ".c")) and "/docs/" not in f)
    checked = 0
    for name in _how_to_add_names():
        if re.fullmatch(r"[\w./-]+\.(py|cpp|h|c|md)", name):
            where = os.path.exists(os.path.join(ROOT, name)) if "/" in name else name in basenames
            assert where, f"docs/architecture.md How to add: {name} is not in the tree"
        elif name.startswith("python -m "):
            module = name.split()[2]
            path = os.path.join(ROOT, *module.split("."))
            assert os.path.isfile(path + ".py") or os.path.isfile(os.path.join(path, "__main__.py")), \
                f"docs/architecture.md How to add: {name} runs no module"
        elif re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*(\(.*\))?", name):
            for part in name.split("(")[0].split("."):
                assert re.search(rf"\b{re.escape(part)}\b", source), \
                    f"docs/architecture.md How to add: `{name}` names {part}, which no source file has"
        else:
            continue
        checked += 1
    assert checked > 50
