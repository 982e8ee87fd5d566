"""The README's commands work as written: every file a `--prompt-file` example reads is either
in the repository or made by a README command just before it. Its layout table matches the tree,
both ways."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _readme_lines():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return f.read().splitlines()


def test_prompt_file_examples_have_their_file(tmp_path):
    lines = _readme_lines()
    uses = [(i, m.group(1)) for i, line in enumerate(lines) for m in re.finditer(r"--prompt-file (\S+)", line)]
    assert uses
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for i, name in uses:
        if os.path.exists(os.path.join(ROOT, name)):
            continue
        makers = [line for line in lines[:i] if re.search(rf">\s*{re.escape(name)}\s*(#|$)", line)]
        assert makers, f"README uses --prompt-file {name} but neither ships it nor shows how to make it"
        cmd = makers[-1].split("#")[0].strip().replace("python3", sys.executable, 1)
        p = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        text = (tmp_path / name).read_text(encoding="utf-8")
        assert len(text.split()) > 200 and text.rstrip().endswith("?")


def test_round_durations_name_the_machine():
    """Durations drift with the machine and its load: each one says where it was measured."""
    text = "\n".join(_readme_lines())
    bench = text[text.index("## The bench"):text.index("## Layout")]
    claims = [p for p in bench.split("\n\n") if re.search(r"\d+(?:\.\d+)?[ -]min", p)]
    assert claims
    for p in claims:
        assert "measured" in p and "2-core" in p, p
    from mnn_h2o.bench.__main__ import main
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main(["--help"])
        except SystemExit:
            pass
    # The --help text used to give its own figures (~15 min, ~2 minutes) that disagreed with
    # the README's; it points there instead.
    assert not re.search(r"\d+(?:\.\d+)?[ -]min", out.getvalue()), out.getvalue()


def _layout_rows():
    """(paths of the left column, backticked names of the right column) per row of the layout table."""
    text = "\n".join(_readme_lines())
    table = text[text.index("## Layout"):text.index("## Using it")]
    rows = []
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or cells[0] == "path" or set(cells[0]) <= set("-"):
            continue
        rows.append((re.findall(r"`([^`]+)`", cells[0]), re.findall(r"`([^`]+)`", cells[1])))
    assert rows
    return rows


def _matches(folder, name):
    import glob

    pattern = os.path.join(ROOT, folder, name.rstrip("/"))
    return glob.glob(pattern) + glob.glob(pattern + ".*")


def test_layout_table_names_exist():
    for paths, names in _layout_rows():
        for p in paths:
            assert os.path.exists(os.path.join(ROOT, p)), f"README layout names {p}, which is not in the tree"
        folders = [p for p in paths if os.path.isdir(os.path.join(ROOT, p))]
        for name in names:
            assert any(_matches(f, name) for f in folders), \
                f"README layout: `{name}` is not in {', '.join(folders)} (backticks in the right column are file names)"


@pytest.mark.parametrize("folder", ["native/src/", "mnn_h2o/", "mnn_h2o/tools/"])
def test_layout_table_names_every_file(folder):
    import fnmatch

    names = [n.rstrip("/") for paths, ns in _layout_rows() if folder in paths for n in ns]
    assert names, f"README layout has no row for {folder}"
    for entry in sorted(os.listdir(os.path.join(ROOT, folder))):
        full = os.path.join(ROOT, folder, entry)
        if entry.startswith(("_", ".")) or entry.endswith(".so"):
            continue  # __init__.py, __pycache__, the developer build's _core*.so
        if os.path.isfile(full) and folder.startswith("mnn_h2o") and not entry.endswith(".py"):
            continue
        assert any(fnmatch.fnmatch(entry, n) or fnmatch.fnmatch(entry, n + ".*") for n in names), \
            f"{folder}{entry} is not named in the README's layout table"
