"""Does a statement read the page history? A small check of query plans, shared by
bench/status_history.py and bench/dashboard_reads.py.

The page table (ocrjobs_page) holds every page ever done: hundreds of thousands after a busy week.
A read that the status, the dashboard or its push make on every tick must reach the few rows it
wants through an index, never by reading the table through:

- SQLite (EXPLAIN QUERY PLAN): a ``SCAN`` of the table, or of an alias Django gave it in the
  statement (``"ocrjobs_page" U0`` shows as ``SCAN U0``), with or without an index: a SCAN visits
  every row; a ``SEARCH`` uses the index's condition.
- PostgreSQL (EXPLAIN (FORMAT JSON)): a ``Seq Scan`` on the table, or an index scan of it with no
  ``Index Cond`` (the whole index read in its order).

Its limit: a search through an index by a condition that matches most of the table (status =
'done' alone) passes. So, on SQLite, does the status's read of the last minute's pages once the
(status, finished_at) index is gone: it searches page_claim_idx by status; PostgreSQL's planner
reads the table through instead, and is caught.

Counted, not timed: a plan says the same on a fast machine and a slow one. At a small size the
planners still choose the index where one serves (checked by tests/bench/test_plans.py on both
databases), so a query that loses its index fails here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

PAGE_TABLE = "ocrjobs_page"
INDEX_SCANS = ("Index Scan", "Index Only Scan")


def explain(connection, sql: str, params) -> list:
    """The plan of one statement: SQLite's rows' details, or PostgreSQL's JSON plan tree."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("EXPLAIN (FORMAT JSON) " + sql, params)
            plan = cursor.fetchone()[0]
            return json.loads(plan) if isinstance(plan, str) else plan
        cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
        return [row[-1] for row in cursor.fetchall()]


def history_reads(vendor: str, sql: str, plan: list) -> list[str]:
    """The steps of ``plan`` (of ``sql``) that read the whole page table; empty when none does."""
    if vendor == "postgresql":
        return [_describe(node) for node in _nodes(plan) if _reads_whole_table(node)]
    names = {PAGE_TABLE, *re.findall(rf'"{PAGE_TABLE}"\s+(?:AS\s+)?"?(\w+)"?', sql, flags=re.IGNORECASE)}
    scan = re.compile(rf"\bSCAN ({'|'.join(sorted(names))})\b")
    return [step for step in plan if scan.search(step)]


def statements(connection, work: Callable[[], object]) -> list[tuple[str, object]]:
    """Each distinct statement (and its first parameters) that ``work`` sends to the database."""
    seen: dict[str, object] = {}

    def record(execute, sql, params, many, context):
        seen.setdefault(sql, params)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        work()
    return list(seen.items())


def history_readers(connection, work: Callable[[], object]) -> list[dict]:
    """The statements of ``work`` on the page table whose plan reads all of it, with those steps."""
    found = []
    for sql, params in statements(connection, work):
        if PAGE_TABLE not in sql or not sql.lstrip().upper().startswith(("SELECT", "WITH")):
            continue
        if steps := history_reads(connection.vendor, sql, explain(connection, sql, params)):
            found.append({"sql": " ".join(sql.split())[:300], "steps": steps})
    return found


def _nodes(plan):
    for entry in plan:
        stack = [entry["Plan"]]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.get("Plans", []))


def _reads_whole_table(node: dict) -> bool:
    if node.get("Relation Name") != PAGE_TABLE:
        return False
    return node["Node Type"] == "Seq Scan" or (node["Node Type"] in INDEX_SCANS and "Index Cond" not in node)


def _describe(node: dict) -> str:
    index = f" using {node['Index Name']}" if "Index Name" in node else ""
    return f"{node['Node Type']}{index} on {node['Relation Name']}"
