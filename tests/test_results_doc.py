"""docs/results.md is what python -m mnn_h2o.tools.results_doc writes from docs/results/ and
docs/data/: the committed file equals the tool's output, a commit hash appears only in a
section's provenance line, every source names its machine, commit and command, every data
file a section names exists (and is read, where a table is drawn from it), and every data file
is named by a section or a notebook page."""
import json
import os
import re

import pytest

from mnn_h2o.tools import results_doc, results_tables

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_MD = os.path.join(ROOT, "docs", "results.md")
PROVENANCE = "*Machine"
BACKTICKED_HASH = re.compile(r"`[0-9a-f]{7,40}`")


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


@pytest.fixture(scope="module")
def real():
    return results_doc.load(results_doc.DOCS)


def test_committed_results_md_is_the_tools_output():
    assert _read(RESULTS_MD) == results_doc.render(), \
        "docs/results.md differs from its sources: run python -m mnn_h2o.tools.results_doc"


def test_commit_hashes_only_in_provenance_lines(real):
    text = _read(RESULTS_MD)
    strays = [line for line in text.splitlines()
              if BACKTICKED_HASH.search(line) and not line.startswith(PROVENANCE)]
    assert not strays, f"commit hashes outside a provenance line (move them to front matter or the notebook): {strays[:3]}"
    # Every section has its line, right under its heading.
    lines = text.splitlines()
    headings = [i for i, line in enumerate(lines) if re.match(r"#{2,3} ", line)]
    sourced = {s.title for s in real[2]}
    for i in headings:
        if lines[i].split(" ", 1)[1] in sourced:
            assert lines[i + 2].startswith(PROVENANCE), f"{lines[i]} has no provenance line under it"


def test_every_source_names_machine_commit_and_command(real):
    _, machines, sections = real
    assert len(sections) > 30
    for s in sections:
        for key in results_doc.REQUIRED:
            assert s.meta.get(key), f"{s.path}: no {key}"
        assert set(results_doc.as_mapping(s.meta["machine"])) <= set(machines), s.path
        assert all(results_doc.HASH.fullmatch(h) for h in results_doc.as_mapping(s.meta["commit"])), s.path
    assert sum(bool(s.meta.get("claim")) for s in sections) >= 20


def test_claim_ranks_are_integers_and_put_the_headline_claims_first(real):
    ranks = [s.meta["claim_rank"] for s in real[2] if "claim_rank" in s.meta]
    assert ranks and all(type(r) is int for r in ranks), ranks
    assert len(set(ranks)) == len(ranks), "two claims share a claim_rank"
    claims = results_doc.claims_table(real[2]).splitlines()[2:]
    assert "predicted_kvzip" in claims[0], "the default policy's claim no longer heads the Claims table"


def test_data_files_exist_and_every_directive_reads_named_data(real):
    _, _, sections = real
    docs = results_doc.DOCS
    drawn = 0
    for s in sections:
        named = s.meta.get("data", [])
        for d in named:
            assert os.path.isfile(os.path.join(docs, d)), f"{s.path} names {d}, which does not exist"
        for kind, args in results_doc.directives(s.body):
            files = [a for a in args if a.startswith("data/")]
            assert files and set(files) <= set(named), f"{s.path}: a {kind} table reads {files}, not all in its data"
            assert results_tables.render(kind, docs, args).startswith("| "), f"{s.path}: {kind} drew no table"
            drawn += 1
    assert drawn >= 1


def test_every_data_file_is_named_where_it_belongs(real):
    """A data file no one names is data no reader can find: each is a section's `data`, or a
    notebook page's (by path or name; the dev-split experiments), or the README picture's input."""
    from mnn_h2o.tools import readme_plot

    docs = results_doc.DOCS
    named = {d for s in real[2] for d in s.meta.get("data", [])}
    notebook = os.path.join(docs, "notebook")
    pages = "".join(_read(os.path.join(notebook, n)) for n in os.listdir(notebook) if n.endswith(".md"))
    orphans = [n for n in sorted(os.listdir(os.path.join(docs, "data")))
               if "data/" + n not in named and n not in pages
               and os.path.join(docs, "data", n) != readme_plot.DEFAULT_JSON]
    assert not orphans, f"docs/data files named by no section's data nor any docs/notebook page: {orphans}"


def test_links_into_results_md_resolve():
    anchors = {results_doc.slug(h) for h in re.findall(r"^#+ (.*)$", _read(RESULTS_MD), re.M)}
    for folder in ("", "docs"):
        for name in os.listdir(os.path.join(ROOT, folder or ".")):
            if name.endswith(".md"):
                for target in re.findall(r"results\.md#([\w-]+)", _read(os.path.join(ROOT, folder, name))):
                    assert target in anchors, f"{os.path.join(folder, name)} links results.md#{target}, which no heading makes"


# --- the generator on a tiny hand-made tree ------------------------------------------------

def _row(method, engine, policy, kl, kl_exact, ratio=3.2):
    return {"kind": "kl", "method": method, "engine": engine, "policy": policy, "kv_dtype": "q8",
            "domain": "code", "prompt_tokens": 4096, "target_ratio": 3.2, "ratio": ratio, "kl": kl,
            "kl_exact": kl_exact}


@pytest.fixture
def tiny(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "data").mkdir()
    (tmp_path / "results" / "machines.yaml").write_text("vm:\n  name: The VM\n  description: 2 cores\n")
    (tmp_path / "results" / "preamble.md").write_text("# Results\n\n<!-- machines -->\n\n## Claims\n\n<!-- claims -->\n")
    (tmp_path / "data" / "peers.json").write_text(json.dumps({"rows": [_row("kvpress:snapkv@q8", "kvpress", "snapkv", 0.004, 0.004)]}))
    (tmp_path / "data" / "ours.json").write_text(json.dumps({"rows": [_row("ours:kvzip@q8", "ours", "kvzip", 0.001, 0.0012)]}))
    (tmp_path / "results" / "01-first.md").write_text(
        "---\ntitle: 'First: a claim'\nclaim: It is good\nfigure: '**4x** better'\nmachine: vm\ncommit: \"0123456\"\n"
        "wall: 2 min\ndata: [data/peers.json, data/ours.json]\ncommand: |\n  python -m x --y\n---\n"
        "Prose.\n\n<!-- table: fair ours:kvzip@q8 data/peers.json data/ours.json -->\n")
    (tmp_path / "results" / "02-second.md").write_text(
        "---\ntitle: Second\nlevel: 3\nmachine: {vm: the speeds}\ncommit: {\"abcdef0\": a, \"1234567\": b}\n"
        "command: python -m z\n---\nBefore.\n\n<!-- command -->\n\n| a |\n|---|\n| 1 |\n")
    return tmp_path


TINY_MD = """# Results

- **The VM**: 2 cores

## Claims

| claim | current figure | section |
|---|---|---|
| It is good | **4x** better | [First: a claim](#first-a-claim) |

## First: a claim

*Machine: The VM; commit `0123456`; wall 2 min; data: [data/peers.json](data/peers.json), [data/ours.json](data/ours.json).*

```bash
python -m x --y
```

Prose.

| prompt | target | domain | default (ours:kvzip@q8): x / KL | q8 alone | best one-pass press@q8: press, x / KL | KVzip@q8: x / KL | default / best press | default / KVzip@q8 | kl_exact: default / best press |
|---:|---:|---|---|---:|---|---|---:|---:|---|
| 4096 | 3.2 | code | 3.20 / 0.0010 | - | snapkv, 3.20 / 0.0040 | - | 0.25 | - | 0.0012 / 0.0040 |

### Second

*Machine: The VM (the speeds); commits `abcdef0` (a), `1234567` (b).*

Before.

```bash
python -m z
```

| a |
|---|
| 1 |
"""


def test_tiny_tree_renders_exactly(tiny):
    assert results_doc.render(str(tiny)) == TINY_MD


def test_check_and_write(tiny, capsys):
    out = tiny / "results.md"
    assert results_doc.main(["--docs", str(tiny), "--check"]) == 1  # nothing written yet
    assert results_doc.main(["--docs", str(tiny)]) == 0
    assert out.read_text() == TINY_MD
    assert results_doc.main(["--docs", str(tiny), "--check"]) == 0
    out.write_text(TINY_MD.replace("0.0040", "0.0041"))
    capsys.readouterr()
    assert results_doc.main(["--docs", str(tiny), "--check"]) == 1
    assert "-| 4096 | 3.2 | code | 3.20 / 0.0010 | - | snapkv, 3.20 / 0.0041" in capsys.readouterr().out


@pytest.mark.parametrize("edit,message", [
    (("machine: vm", "machine: other"), "machine 'other' is not in"),
    (("commit: \"0123456\"", "commit: 0123456"), "is not a hash"),
    (("command: |\n  python -m x --y\n", ""), "needs command"),
    (("claim: It is good\n", "claim: It is good\nclaims: x\n"), "unknown key claims"),
    (("figure: '**4x** better'\n", ""), "a claim needs its current figure"),
    (("<!-- table: fair", "<!-- table: pie"), "no table kind 'pie'"),
    (("claim: It is good\n", "claim: It is good\nclaim_rank: first\n"), "claim_rank must be an integer"),
])
def test_bad_sources_are_refused(tiny, capsys, edit, message):
    first = tiny / "results" / "01-first.md"
    first.write_text(first.read_text().replace(*edit))
    assert results_doc.main(["--docs", str(tiny), "--check"]) == 2
    assert message in capsys.readouterr().err


def test_claims_ordered_by_rank_then_section(tiny):
    second = tiny / "results" / "02-second.md"
    second.write_text(second.read_text().replace("level: 3\n", "level: 3\nclaim: Ranked\nfigure: '1'\nclaim_rank: 1\n"))
    claims = results_doc.claims_table(results_doc.load(str(tiny))[2]).splitlines()[2:]
    assert [c.split(" | ")[0] for c in claims] == ["| Ranked", "| It is good"]


def test_fair_points_bolds_a_missed_bar_from_the_rule(tiny):
    # 0.0050 against the best press's 0.0040 is 1.25x: above the 1.1x bar, so bold.
    (tiny / "data" / "ours.json").write_text(json.dumps({"rows": [_row("ours:kvzip@q8", "ours", "kvzip", 0.005, 0.005)]}))
    table = results_tables.render("fair_points", str(tiny), ["ours:kvzip@q8", "data/peers.json", "data/ours.json",
                                                             "cols=kl,best,vs_best"])
    assert table.splitlines()[2] == "| 3.2 | code | 0.0050 | snapkv, 0.0040 | **1.25** |"
