"""Many rows or ids in one statement (fleetadmin/sqlbatch.py): they come back as they went, on
either database; on PostgreSQL the statement's text is the same whatever their count (psycopg
parses it once) and the planner knows how many rows the batch holds (it looks them up by key)."""

from __future__ import annotations

import json
import math

import pytest
from django.db import connection

from fleetadmin.sqlbatch import id_list, ids_in, rows_table
from ocrjobs.models import Document, Job, Page

COLUMNS = [("id", "bigint"), ("note", "text"), ("score", "double precision")]
ROWS = [
    [1, 'a "quoted" \\ note, é, {braces}', 0.25],
    [2, None, None],
    [3, "", -1.5e300],
    [4, "NULL", 3],
]


def _read_back(rows: list[list]) -> list[tuple]:
    values, params = rows_table("v", COLUMNS, rows)
    with connection.cursor() as cursor:
        cursor.execute(f"WITH {values} SELECT id, note, score FROM v ORDER BY id", params)
        return cursor.fetchall()


def test_rows_come_back_as_they_went_text_numbers_and_nulls(db):
    assert _read_back(ROWS) == [tuple(row) for row in ROWS]


@pytest.mark.once_postgres  # SQLite keeps a NaN as NULL, whatever goes in
def test_a_nan_or_an_infinity_comes_back_as_itself(db):
    back = _read_back([[1, "x", float("nan")], [2, "y", float("inf")], [3, "z", float("-inf")]])

    assert math.isnan(back[0][2]) and back[1][2] == math.inf and back[2][2] == -math.inf


@pytest.mark.once_postgres
def test_on_postgresql_the_statement_is_the_same_for_one_row_or_a_thousand_ids_or_one():
    one, _ = rows_table("v", COLUMNS, ROWS[:1])
    many, params = rows_table("v", COLUMNS, ROWS * 400)

    assert one == many and len(params) == len(COLUMNS)  # an array a column
    assert ids_in([7])[0] == ids_in(range(1000))[0]


@pytest.mark.once_postgres
def test_on_postgresql_the_planner_is_told_how_many_rows_a_batch_holds(db):
    values, params = rows_table("v", COLUMNS, ROWS * 10)
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) WITH {values} SELECT id FROM v", params)
        plan = cursor.fetchone()[0]
    plan = plan if isinstance(plan, list) else json.loads(plan)

    # 40, not the 100 a function returning rows is guessed at: so a batch is looked up by its keys.
    assert plan[0]["Plan"]["Plan Rows"] == 40


def test_ids_select_those_rows_and_no_other(db, local_pool):
    job = Job.objects.create(pool=local_pool)
    document = Document.objects.create(job=job, position=0, name="d.pdf", kind="pdf", source="jobs/d.pdf",
                                       size_bytes=1, page_count=5)  # fmt: skip
    pages = Page.objects.bulk_create([Page(job=job, document=document, pool=local_pool, number=n) for n in range(1, 6)])
    wanted = [pages[0].pk, pages[3].pk, pages[4].pk]

    sql, params = ids_in(wanted)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id FROM {Page._meta.db_table} WHERE id {sql}", params)
        raw = {row[0] for row in cursor.fetchall()}

    assert raw == set(wanted)
    assert set(Page.objects.filter(id__in=id_list(wanted)).values_list("id", flat=True)) == set(wanted)


@pytest.mark.once_postgres
def test_joined_by_hash_rules_out_nested_loops_for_its_statements_alone(db):
    from django.db import transaction

    from fleetadmin.sqlbatch import joined_by_hash

    def nested_loops() -> str:
        with connection.cursor() as cursor:
            cursor.execute("SHOW enable_nestloop")
            return cursor.fetchone()[0]

    with transaction.atomic():  # a caller's transaction, which goes on afterwards
        with joined_by_hash():
            assert nested_loops() == "off"
        assert nested_loops() == "on"
    assert nested_loops() == "on"
