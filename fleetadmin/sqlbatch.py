"""Many rows, or many ids, in one SQL statement whose text does not grow with them (PostgreSQL).

psycopg turns a statement's ``%s`` placeholders into its own on every execute and caches the result
only for statements of at most 50 parameters and 4,096 characters; a batch of a placeholder per
value (a VALUES row per page, an ``IN`` list of ids) is parsed again, placeholder by placeholder,
each time. In a dispatcher storing a page's result, the pod it went to and renewing its claims,
that parsing was a sixth of its CPU at 64 pods x 8 lanes (issue 37). On PostgreSQL each column
goes as one array literal instead, unnested: a parameter per column, a statement psycopg parses
once. Arrays, not one JSON parameter: psycopg writes parameters into the statement, so the planner
reads a constant array's length (unnest's own estimate) and looks each row up by its key, where it
guessed 100 rows from json_array_elements and scanned every running page, 5 ms a flush against
0.09 ms. SQLite takes a placeholder per value, as before (its driver does not parse them in Python).

``IdsOf``: a few bounded reads of ids, one statement. ``joined_by_hash``: such a batch joined to its
table without a nested loop.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

from django.db import connection, transaction
from django.db.models import BigIntegerField, Expression
from django.db.models.expressions import RawSQL


def _element(value: object, text: bool) -> str:
    if value is None:
        return "NULL"
    if text:
        return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return repr(float(value))  # float8 reads "nan", "inf" and "-inf" too


def _array(values: Iterable[object], kind: str) -> str:
    """A PostgreSQL array literal of ``values``, elements of the SQL type ``kind``."""
    text = kind == "text"
    return "{" + ",".join(_element(value, text) for value in values) + "}"


def rows_table(alias: str, columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[object]]) -> tuple[str, list]:
    """``alias(column, ...) AS (...)``, for a WITH clause, holding ``rows`` (each a value per column of
    ``columns``, (name, SQL type) pairs: numbers or text), and its parameters."""
    names = ", ".join(name for name, _ in columns)
    if connection.vendor == "postgresql":
        arrays = ", ".join(f"CAST(%s AS {kind}[])" for _, kind in columns)
        values = zip(*rows, strict=True) if rows else [()] * len(columns)  # the rows, column by column
        params = [_array(column, kind) for column, (_, kind) in zip(values, columns, strict=True)]
        return f"{alias}({names}) AS (SELECT * FROM unnest({arrays}))", params
    row = "(" + ", ".join(f"CAST(%s AS {kind})" for _, kind in columns) + ")"
    return f"{alias}({names}) AS (VALUES {', '.join([row] * len(rows))})", [value for row in rows for value in row]


@contextmanager
def joined_by_hash() -> Iterator[None]:
    """The statements run inside join a batch (``rows_table``) to its table by hashing one side,
    never by a nested loop (PostgreSQL: ``enable_nestloop`` off for them alone).

    Why: the planner estimates how many of a table's rows a statement's filters keep from the
    table's statistics, and a batch's filters name what those statistics cannot know. Pages held
    by a claim token made a second ago, running when the statistics saw none: one row, it
    estimates, where thousands match. For one row, a nested loop that reads the batch once per
    match is cheapest, it reckons: in truth the batch times the matches. A flush of 1,100 results
    took 1.2 s at 256 pods x 8 lanes (bench/dispatch.py), up to 11.8 s, where it takes
    milliseconds joined by a hash. PostgreSQL takes no hints; its enable_* settings are its way to
    rule a plan out, here for these statements only (``SET LOCAL``: within their transaction,
    set back after them when that transaction is a caller's)."""
    if connection.vendor != "postgresql":
        yield
        return
    outer = connection.in_atomic_block  # a caller's transaction, which goes on after this
    with transaction.atomic():
        with connection.cursor() as cursor:
            if outer:
                cursor.execute("SHOW enable_nestloop")
                before = cursor.fetchone()[0]
            cursor.execute("SET LOCAL enable_nestloop = off")
        yield  # on an error, the rollback (to the savepoint, in a caller's transaction) sets it back
        if outer:
            with connection.cursor() as cursor:
                cursor.execute("SELECT set_config('enable_nestloop', %s, true)", [before])


def ids_in(ids: Iterable[int]) -> tuple[str, list]:
    """``IN`` the ids, as the SQL that follows a column (``id {sql}``) and its parameters."""
    ids = [int(value) for value in ids]
    if connection.vendor == "postgresql":
        return "= ANY(CAST(%s AS bigint[]))", [_array(ids, "bigint")]
    return f"IN ({', '.join(['%s'] * len(ids))})", ids


def id_list(ids: Iterable[int]) -> list[int] | RawSQL:
    """What a queryset's ``id__in=`` takes for ``ids``: one array parameter on PostgreSQL."""
    ids = [int(value) for value in ids]
    if connection.vendor == "postgresql":
        return RawSQL("SELECT unnest(CAST(%s AS bigint[]))", [_array(ids, "bigint")])
    return ids


class IdsOf(Expression):
    """The ids a few sliced querysets select, as one subquery: ``filter(pk__in=IdsOf(a, b))``.

    Each part is a short walk down an index (``ORDER BY … LIMIT n``); the parts are joined with
    UNION ALL, each wrapped in a derived table (SQLite refuses LIMIT in a compound's parts).
    Several bounded reads become one statement, a round trip and a plan fewer, without the
    ``pk IN (…) OR pk IN (…)`` that PostgreSQL ran by filtering every row of the table.
    """

    output_field = BigIntegerField()

    def __init__(self, *parts) -> None:
        super().__init__()
        if not parts:
            raise ValueError("IdsOf needs at least one queryset")
        self.parts = [part.values("pk") for part in parts]

    def as_sql(self, compiler, connection):
        sqls, params = [], []
        for i, part in enumerate(self.parts):
            sql, part_params = part.query.get_compiler(connection=connection).as_sql()
            sqls.append(f"SELECT * FROM ({sql}) ids_{i}")
            params.extend(part_params)
        return "(" + " UNION ALL ".join(sqls) + ")", params
