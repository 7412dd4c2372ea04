"""The example study reports in docs/examples are what `make examples` writes from their stored runs today: a change
to the code, a study file or a preset that alters a report fails here until the examples are regenerated."""

from __future__ import annotations

import shutil
import sqlite3
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "docs/examples"
RUNS = EXAMPLES / "runs.db"


def _node() -> str:
    with sqlite3.connect(f"file:{RUNS}?mode=ro&immutable=1", uri=True) as con:
        nodes = [row[0] for row in con.execute("SELECT DISTINCT node FROM runs WHERE node IS NOT NULL")]
    con.close()
    assert len(nodes) == 1, nodes  # the examples are one machine's
    return nodes[0]


@pytest.mark.parametrize("name", ["a", "b", "c", "c-nfs", "d", "ladder"])
def test_each_example_report_is_what_its_stored_runs_give_today(name, cli_run, tmp_path, monkeypatch):
    monkeypatch.setenv("TZ", "UTC")  # as make examples writes them
    time.tzset()
    db = tmp_path / "results.db"
    shutil.copyfile(RUNS, db)  # the report opens its database for writing
    out = tmp_path / f"study-{name}-quick-tcg.md"
    try:
        code, _, err = cli_run(["study", "report", name, "--db", str(db), "--node", _node(), "-o", str(out)])
    finally:
        monkeypatch.undo()
        time.tzset()
    assert code == 0, err
    assert out.read_text() == (EXAMPLES / out.name).read_text(), f"docs/examples/{out.name} is stale: make examples"


def test_study_as_second_quick_run_is_compared_as_make_examples_writes_it(cli_run, tmp_path, monkeypatch):
    """docs/examples/study-a-quick-tcg-again.txt: `study compare a` of runs.db against runs-a-again.db (the same quick
    run a second time, from nothing), in which no rule's interval lies wholly on opposite sides."""
    again = EXAMPLES / "runs-a-again.db"
    for src in (RUNS, again):
        shutil.copyfile(src, tmp_path / src.name)  # named as the text names them; compare opens them for writing
    monkeypatch.chdir(tmp_path)
    code, out, err = cli_run(["study", "compare", "a", RUNS.name, again.name, "--size", "quick", "--node", _node()])
    assert out == (EXAMPLES / "study-a-quick-tcg-again.txt").read_text(), "docs/examples is stale: make examples"
    assert code == 0 and "on opposite sides: 0" in out, out


def test_a_table_whose_figures_share_their_qualifiers_says_them_once_under_it():
    text = (EXAMPLES / "study-b-quick-tcg.md").read_text()
    # no "(emulated, quick)" in each cell
    assert "| `kvm-cache-none` | - | 84.1 | - | 31.8 [24.9, 55.6] (90%) |" in text
    assert "Every guest figure of ours in this table is emulated, quick (see the notes on these words below)." in text
