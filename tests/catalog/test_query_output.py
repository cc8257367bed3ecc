"""``auditor query``'s output: the table stops at 1,000 rows by default and says how many
it did not show (a rich table of 150,000 rows took 22 s to draw), ``--limit N`` (0: all)
for every format, ``--json`` and ``--csv`` print every row unless given one."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from auditor._cli import main
from tests.helpers import example_catalogue

ROWS = "SELECT range AS i, 'r' || range AS s FROM range({n})"


@pytest.fixture(scope="module")
def cat(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return example_catalogue(tmp_path_factory.mktemp("query-output"))


def query(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[str, str]:
    capsys.readouterr()
    assert main(["query", *argv]) == 0
    captured = capsys.readouterr()
    return captured.out, captured.err


def shown(table: str) -> list[int]:
    """The ``i`` values of the rows a table shows."""
    return [int(line.split("│")[1]) for line in table.splitlines()
            if line.startswith("│") and line.split("│")[1].strip().isdigit()]


def test_the_table_shows_the_first_1000_rows_and_says_how_many_it_did_not(
        cat: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, err = query(capsys, str(cat), ROWS.format(n=150_000))
    assert shown(out) == list(range(1000))
    assert out.splitlines()[-1] == (
        "1,000 of 150,000 row(s) shown, 149,000 not shown (--limit 0 shows them all; --csv "
        "and --json print every row)")
    assert err == ""


def test_a_result_within_the_limit_is_shown_whole(
        cat: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, _ = query(capsys, str(cat), ROWS.format(n=1000))
    assert shown(out) == list(range(1000)) and out.splitlines()[-1] == "1,000 row(s)"
    out, _ = query(capsys, str(cat), "SELECT * FROM periods WHERE false")
    assert out.splitlines()[-1] == "0 row(s)"


@pytest.mark.parametrize(("limit", "count", "last"), [
    ("0", 1500, "1,500 row(s)"),
    ("10", 10, "10 of 1,500 row(s) shown, 1,490 not shown (--limit 0 shows them all; --csv "
     "and --json print every row)"),
    ("1500", 1500, "1,500 row(s)"),
    ("2000", 1500, "1,500 row(s)"),
])
def test_limit_sets_the_tables_rows(cat: Path, capsys: pytest.CaptureFixture[str],
                                    limit: str, count: int, last: str) -> None:
    out, _ = query(capsys, str(cat), ROWS.format(n=1500), "--limit", limit)
    assert shown(out) == list(range(count)) and out.splitlines()[-1] == last


def test_json_and_csv_print_every_row_unless_limited(
        cat: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sql = ROWS.format(n=1500)
    out, err = query(capsys, str(cat), sql, "--json")
    assert len(json.loads(out)) == 1500 and err == ""
    out, err = query(capsys, str(cat), sql, "--csv")
    assert len(list(csv.reader(io.StringIO(out)))) == 1 + 1500 and err == ""
    out, err = query(capsys, str(cat), sql, "--json", "--limit", "2")
    assert json.loads(out) == [{"i": 0, "s": "r0"}, {"i": 1, "s": "r1"}]
    assert err == "query: 2 of 1,500 row(s) printed (--limit 2)\n"  # (stdout: the rows only)
    out, err = query(capsys, str(cat), sql, "--csv", "--limit", "3")
    assert out.splitlines() == ["i,s", "0,r0", "1,r1", "2,r2"]
    assert err == "query: 3 of 1,500 row(s) printed (--limit 3)\n"
    out, err = query(capsys, str(cat), sql, "--csv", "--limit", "0")
    assert len(out.splitlines()) == 1 + 1500 and err == ""


@pytest.mark.parametrize(("limit", "said"), [
    ("-1", "-1 is not a number of rows (0: all)"),
    ("many", "'many' is not a whole number of rows"),
    ("1.5", "'1.5' is not a whole number of rows"),
])
def test_a_bad_limit_is_one_line(cat: Path, capsys: pytest.CaptureFixture[str],
                                 limit: str, said: str) -> None:
    capsys.readouterr()
    assert main(["query", str(cat), "SELECT 1", "--limit", limit]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and said in err, err


def test_the_help_says_the_limit(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["query", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--limit N print at most N rows, 0 for all (default: the table 1,000, then a " \
        "line saying how many were not shown; --json and --csv every row)" in text


def test_a_repeated_column_name_is_made_unique_so_no_json_value_is_lost(
        cat: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, _ = query(capsys, str(cat), "SELECT 1 AS a, 2 AS a, 3 AS a", "--json")
    assert json.loads(out) == [{"a": 1, "a_1": 2, "a_2": 3}]
    join = ("SELECT p.study, a.study, p.subject FROM periods p JOIN attempts a USING "
            "(subject) ORDER BY p.subject LIMIT 1")
    out, _ = query(capsys, str(cat), join, "--json")
    assert json.loads(out) == [{"study": "estimation_host_capacity",
                                "study_1": "estimation_host_capacity",
                                "subject": "host-qwen25-7b-code_heavy_tail-c2-s161/period-1"}]
    out, _ = query(capsys, str(cat), "SELECT 1 AS a, 2 AS a", "--csv")
    assert out.splitlines() == ["a,a_1", "1,2"]
    out, _ = query(capsys, str(cat), "SELECT 1 AS a, 2 AS a")
    assert [cell.strip() for cell in out.splitlines()[1].split("┃")[1:-1]] == ["a", "a_1"]


@pytest.mark.parametrize("sql", [
    "SELECT 1 AS a, 2 AS a, 3 AS a_1",  # (a_1 taken by the second a: a_1_1)
    "SELECT 1 AS a_1, 2 AS a, 3 AS a",  # (a_1 taken first: a_2)
    "SELECT 1 AS a, 2 AS A",  # (DuckDB's names are case-insensitive: A_1)
    'SELECT 1 AS "Ä", 2 AS "ä", 3 AS ss, 4 AS "SS"',  # (in their ASCII letters only)
])
def test_the_names_are_those_of_the_same_query_as_a_subquery(
        cat: Path, capsys: pytest.CaptureFixture[str], sql: str) -> None:
    out, _ = query(capsys, str(cat), sql, "--json")
    wrapped, _ = query(capsys, str(cat), f"SELECT * FROM ({sql})", "--json")
    assert json.loads(out) == json.loads(wrapped)
    assert len(json.loads(out)[0]) == sql.count(" AS ")
