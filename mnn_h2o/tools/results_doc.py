"""docs/results.md, written from its sources: docs/results/*.md and docs/data/.

    python -m mnn_h2o.tools.results_doc            # write docs/results.md
    python -m mnn_h2o.tools.results_doc --check    # exit 1 if the committed file differs

To change a figure, edit docs/results/NN-name.md (or the data file a table is drawn from) and
run the tool; docs/results.md is never edited by hand (tests/test_results_doc.py fails when it
differs from what the tool writes).

docs/results/preamble.md is the page's title and introduction; its line `<!-- machines -->`
becomes the list of docs/results/machines.yaml and `<!-- claims -->` the Claims table. Each
NN-name.md (NN orders them) is one section: a front matter block, then the body.

    ---
    title: The fair frontier            # the heading, and so the anchor other docs link to
    level: 3                            # optional: a subsection of the section before (default 2)
    claim: Against presses over ...     # optional: a row of the Claims table ...
    figure: the default's mean KL ...   # ... with the current headline figure (needed with claim)
    claim_rank: 1                       # optional: the claim's place in the Claims table (an integer)
    also: [Another section's title]     # optional: more sections the claim's row links to
    machine: amd-vm                     # a key of machines.yaml, or {key: what it measured, ...}
    commit: "f3c2e01"                   # the code measured, or {"hash": what it measured, ...}
    wall: 25 min                        # optional: how long the main table took
    data: [data/a.json]                 # optional: the raw data, relative to docs/
    command: |                          # what reproduces the section's main table
      python -m mnn_h2o.eval frontier ...
    ---

The Claims table lists the claims by claim_rank (the most important first), then the unranked
ones in section order. The section is written as its heading, one provenance line (machine, commit, wall, data: the
only place a commit hash appears), the command (where the body has a line `<!-- command -->`,
else right after the provenance line), then the body. A body line `<!-- table: KIND ARGS -->`
is replaced by the table KIND draws from docs/data (mnn_h2o/tools/results_tables.py lists the
kinds and their ARGS), so a table with a data file cannot drift from it.
"""
from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
from dataclasses import dataclass
from typing import Callable, List

import yaml

from .results_tables import TABLES
from .results_tables import render as render_table

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = os.path.join(ROOT, "docs")
REQUIRED = ("title", "machine", "commit", "command")
OPTIONAL = ("level", "claim", "claim_rank", "figure", "also", "wall", "data")
HASH = re.compile(r"[0-9a-f]{7,40}")
COMMAND_HERE = "<!-- command -->"
TABLE = re.compile(r"^<!-- table: (\S+)((?: \S+)*) -->$")


@dataclass
class Section:
    path: str
    meta: dict
    body: str

    @property
    def title(self) -> str:
        return self.meta["title"]


def slug(title: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def read_section(path: str, machines: dict) -> Section:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    m = re.match(r"---\n(.*?)\n---\n", text, re.S)
    if not m:
        raise ValueError(f"{path}: no front matter (a block between two '---' lines at the top)")
    meta = yaml.safe_load(m.group(1)) or {}
    name = "docs/results/" + os.path.basename(path)
    missing = [k for k in REQUIRED if not meta.get(k)]
    unknown = sorted(set(meta) - set(REQUIRED) - set(OPTIONAL))
    if missing or unknown:
        raise ValueError(f"{name}: " + "; ".join(
            ([f"needs {', '.join(missing)}"] if missing else []) + ([f"unknown key {', '.join(unknown)}"] if unknown else [])))
    if meta.get("claim") and not meta.get("figure"):
        raise ValueError(f"{name}: a claim needs its current figure")
    if "claim_rank" in meta and not (meta.get("claim") and type(meta["claim_rank"]) is int):
        raise ValueError(f"{name}: claim_rank must be an integer, beside a claim")
    for key in as_mapping(meta["machine"]):
        if key not in machines:
            raise ValueError(f"{name}: machine {key!r} is not in docs/results/machines.yaml")
    for h in as_mapping(meta["commit"]):
        # YAML reads an all-digit hash as a number: the hash must be quoted.
        if not isinstance(h, str) or not HASH.fullmatch(h):
            raise ValueError(f"{name}: commit {h!r} is not a hash (7-40 hex digits, quoted)")
    return Section(path, meta, text[m.end():].strip("\n"))


def as_mapping(value) -> dict:
    """A front matter value given as one item or as {item: what it covers}."""
    return value if isinstance(value, dict) else {value: None}


def _items(value, show: Callable[[str], str]) -> str:
    return ", ".join(show(k) + (f" ({what})" if what else "") for k, what in as_mapping(value).items())


def provenance(meta: dict, machines: dict) -> str:
    several = lambda v: "s" if len(as_mapping(v)) > 1 else ""  # noqa: E731
    parts = [f"Machine{several(meta['machine'])}: {_items(meta['machine'], lambda k: machines[k]['name'])}",
             f"commit{several(meta['commit'])} {_items(meta['commit'], lambda h: f'`{h}`')}"]
    if meta.get("wall"):
        parts.append(f"wall {meta['wall']}")
    if meta.get("data"):
        parts.append("data: " + ", ".join(f"[{d}]({d})" for d in meta["data"]))
    return "*" + "; ".join(parts) + ".*"


def directives(body: str) -> List[tuple]:
    """(kind, args) of each table directive of a body."""
    return [(m.group(1), m.group(2).split()) for m in map(TABLE.match, body.splitlines()) if m]


def render_body(section: Section, docs: str) -> str:
    command = "```bash\n" + section.meta["command"].rstrip("\n") + "\n```"
    lines = []
    for line in section.body.splitlines():
        m = TABLE.match(line)
        if m:
            if m.group(1) not in TABLES:
                raise ValueError(f"docs/results/{os.path.basename(section.path)}: no table kind {m.group(1)!r} "
                                 f"(known: {', '.join(TABLES)})")
            line = render_table(m.group(1), docs, m.group(2).split())
        elif line == COMMAND_HERE:
            line = command
        lines.append(line)
    body = "\n".join(lines)
    return body if COMMAND_HERE in section.body else command + "\n\n" + body


def load(docs: str):
    """(preamble text, machines, sections in order) of a docs tree."""
    src = os.path.join(docs, "results")
    with open(os.path.join(src, "machines.yaml"), encoding="utf-8") as f:
        machines = yaml.safe_load(f)
    for key, m in machines.items():
        if not (isinstance(m, dict) and m.get("name") and m.get("description")):
            raise ValueError(f"docs/results/machines.yaml: {key} needs a name and a description")
    with open(os.path.join(src, "preamble.md"), encoding="utf-8") as f:
        preamble = f.read().strip("\n")
    names = sorted((n for n in os.listdir(src) if re.fullmatch(r"\d+-.+\.md", n)), key=lambda n: int(n.split("-")[0]))
    sections = [read_section(os.path.join(src, n), machines) for n in names]
    titles = [s.title for s in sections]
    for s in sections:
        for t in s.meta.get("also", []):
            if t not in titles:
                raise ValueError(f"docs/results/{os.path.basename(s.path)}: also names {t!r}, which no section has")
    dup = {slug(t) for t in titles if [slug(u) for u in titles].count(slug(t)) > 1}
    if dup:
        raise ValueError(f"docs/results: two sections share the anchor {', '.join(sorted(dup))}")
    return preamble, machines, sections


def claims_table(sections: List[Section]) -> str:
    link = lambda t: f"[{t}](#{slug(t)})"  # noqa: E731
    rows = ["| claim | current figure | section |", "|---|---|---|"]
    claimed = [s for s in sections if s.meta.get("claim")]
    # sorted() is stable: equal ranks, and the unranked after them, keep section order.
    for s in sorted(claimed, key=lambda s: s.meta.get("claim_rank", float("inf"))):
        cells = [" ".join(s.meta["claim"].split()), " ".join(s.meta["figure"].split()),
                 ", ".join(link(t) for t in [s.title] + list(s.meta.get("also", [])))]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def render(docs: str = DOCS) -> str:
    preamble, machines, sections = load(docs)
    machine_list = "\n".join(f"- **{m['name']}**: {m['description']}" for m in machines.values())
    parts = [preamble.replace("<!-- machines -->", machine_list).replace("<!-- claims -->", claims_table(sections))]
    for s in sections:
        parts.append("#" * s.meta.get("level", 2) + " " + s.title + "\n\n"
                     + provenance(s.meta, machines) + "\n\n" + render_body(s, docs))
    return "\n\n".join(parts) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mnn_h2o.tools.results_doc", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--docs", default=DOCS, help="the docs folder: results/ and data/ in, results.md out "
                                                 "(default: the checkout's docs/)")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if results.md differs from what "
                                                        "the tool would write")
    args = ap.parse_args(argv)
    out = os.path.join(args.docs, "results.md")
    try:
        text = render(args.docs)
    except (OSError, ValueError, yaml.YAMLError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.check:
        try:
            with open(out, encoding="utf-8") as f:
                committed = f.read()
        except FileNotFoundError:
            committed = ""
        if committed == text:
            return 0
        diff = list(difflib.unified_diff(committed.splitlines(), text.splitlines(), "results.md (committed)",
                                         "results.md (from docs/results/)", n=1, lineterm=""))
        print("\n".join(diff[:60]) + (f"\n... {len(diff) - 60} more diff lines" if len(diff) > 60 else ""))
        print(f"{out} differs from its sources: run python -m mnn_h2o.tools.results_doc", file=sys.stderr)
        return 1
    with open(out, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
