"""Hot reads whose SQL Django builds once per process, then runs with each call's values.

The dashboard makes the same handful of reads every second. Django building the querysets
and compiling them to SQL cost more of a push's CPU than the databases took to answer them
(13-17 ms of ~25 at 500 pods and 300 jobs, bench/status_history.py). A read decorated with
``compiled_read`` is written as usual, a function that returns a queryset, but its arguments
are stand-ins the first time: Django compiles it, the stand-ins are found again among the
SQL's parameters, and later calls run the same SQL with their own values in their places.
Rows are converted as the ORM converts them (model instances with their select_related, or
values_list tuples), so a compiled read returns what the queryset would.

The queryset must depend on the arguments only, and on them through filter values: a
datetime argument may be shifted by a fixed amount (``now - WINDOW``), an int (or each int of
a list) is used as it is. It is compiled twice with different stand-ins, and refused
(ValueError) if the two compilations differ in anything but those parameters: an argument
inlined in the SQL (a slice), turned into a date or a minute, or a clock read inside.
"""

from __future__ import annotations

import functools
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.core.exceptions import EmptyResultSet
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import BigIntegerField, Expression
from django.db.models.query import ModelIterable, ValuesListIterable, get_related_populators

# Datetime stand-ins lie in the 18th-19th centuries (nine at most), SPACING apart: a parameter
# within half of it from one is that stand-in shifted. The second compilation's are shifted by an
# odd amount, so that a value made of an argument other than by a shift (a date, a minute) shows.
_BASE = datetime(1700, 1, 1, tzinfo=UTC)
_SPACING = timedelta(days=10_000)
_SECOND_SHIFT = timedelta(days=3, hours=7, minutes=11, seconds=13, microseconds=17)
_INT_BASE = (1_900_000_000, 1_950_000_000)  # (below 2**31: stand-ins for any integer column)
_NAIVE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)?$")  # a datetime as SQLite's backend adapts it
SHAPES_KEPT = 64  # compilations kept per read: one per database and argument shape (lengths of lists)


@dataclass(frozen=True)
class _Compiled:
    sql: str | None  # None: no row whatever the values
    params: tuple  # each: ("constant", value) or ("int" | "datetime", name, index in list or None, shift)
    compiler: object  # the compiler that made the SQL: it converts the rows
    instances: bool  # model instances (else values_list() tuples)


def _stand_in(kind: type, slot: int, item: int, second: bool):
    if kind is datetime:  # (one datetime a slot)
        return _BASE + (_SECOND_SHIFT if second else timedelta(0)) + _SPACING * slot
    return _INT_BASE[second] + slot * 100_000 + item


def _as_datetime(param) -> datetime | None:
    if isinstance(param, datetime):
        return param if param.tzinfo else param.replace(tzinfo=UTC)
    if isinstance(param, str) and _NAIVE.match(param):
        return datetime.fromisoformat(param).replace(tzinfo=UTC)
    return None


class CompiledRead:
    """A read compiled once per database and shape of its arguments (``compiled_read``)."""

    def __init__(self, build: Callable) -> None:
        self.build = build
        self._compiled: OrderedDict[tuple, _Compiled] = OrderedDict()
        self._lock = threading.Lock()
        functools.update_wrapper(self, build)

    def __call__(self, *, using: str = DEFAULT_DB_ALIAS, **values) -> list:
        shape = tuple(sorted((name, len(v) if isinstance(v, list | tuple) else type(v)) for name, v in values.items()))
        key = (using, shape)
        with self._lock:
            compiled = self._compiled.get(key)
            if compiled is not None:
                self._compiled.move_to_end(key)
        if compiled is None:
            compiled = self._compile(using, values)
            with self._lock:
                self._compiled[key] = compiled
                while len(self._compiled) > SHAPES_KEPT:
                    self._compiled.popitem(last=False)
        return self._run(compiled, using, values)

    def forget(self) -> None:
        """Compile again at the next call (tests)."""
        with self._lock:
            self._compiled.clear()

    # --- compiling ---

    def _stand_ins(self, values: dict, second: bool) -> tuple[dict, dict]:
        """(the arguments to build with, {stand-in: (kind, name, index)})."""
        arguments, found = {}, {}
        for slot, (name, value) in enumerate(sorted(values.items())):
            items = list(value) if isinstance(value, list | tuple) else [value]
            kinds = {datetime if isinstance(v, datetime) else int if isinstance(v, int) else None for v in items}
            if kinds - {datetime, int} or len(kinds) > 1:
                raise ValueError(f"{self.build.__name__}: {name} must be a datetime, an int or a list of ints")
            kind = kinds.pop() if kinds else int
            if kind is datetime and (isinstance(value, list | tuple) or slot > 8):
                raise ValueError(f"{self.build.__name__}: {name}: up to nine datetimes, none in a list")
            stand_ins = [_stand_in(kind, slot, i, second) for i in range(len(items))]
            listed = isinstance(value, list | tuple)
            found.update({s: (kind, name, i if listed else None) for i, s in enumerate(stand_ins)})
            arguments[name] = stand_ins if listed else stand_ins[0]
        return arguments, found

    def _compile(self, using: str, values: dict) -> _Compiled:
        compilations = []
        for second in (False, True):
            arguments, stand_ins = self._stand_ins(values, second)
            queryset = self.build(**arguments)
            if queryset._iterable_class not in (ModelIterable, ValuesListIterable):
                raise ValueError(f"{self.build.__name__}: model instances or values_list() tuples only")
            if queryset._prefetch_related_lookups or queryset._known_related_objects:
                raise ValueError(f"{self.build.__name__}: no prefetch_related, no related manager")
            compiler = queryset.query.get_compiler(using=using)
            try:
                sql, params = compiler.as_sql()
            except EmptyResultSet:  # (an empty list of ids: nothing to read)
                return _Compiled(None, (), compiler, False)
            compilations.append((sql, params, stand_ins, compiler))
        instances = queryset._iterable_class is ModelIterable
        (sql, first, stand_ins, compiler), (sql_again, second, stand_ins_again, _) = compilations
        if sql != sql_again or len(first) != len(second):
            raise ValueError(f"{self.build.__name__}: an argument changes the SQL, not only its parameters")
        by_slot = {(name, i): s for s, (_, name, i) in stand_ins_again.items()}
        params = []
        for a, b in zip(first, second, strict=True):
            params.append(self._param(a, b, stand_ins, by_slot))
        return _Compiled(sql, tuple(params), compiler, instances)

    def _param(self, a, b, stand_ins: dict, by_slot: dict) -> tuple:
        if isinstance(a, int) and not isinstance(a, bool) and a in stand_ins:
            kind, name, i = stand_ins[a]
            if by_slot[(name, i)] == b:
                return ("int", name, i, None)
        at, bt = _as_datetime(a), _as_datetime(b)
        if at is not None and bt is not None and at.year < 1950:
            for stand_in, (kind, name, i) in stand_ins.items():
                if kind is datetime and abs(at - stand_in) < _SPACING / 2 and bt - by_slot[(name, i)] == at - stand_in:
                    return ("datetime", name, i, at - stand_in)
        if a == b and type(a) is type(b):
            return ("constant", a)
        raise ValueError(f"{self.build.__name__}: a parameter ({a!r}) is not an argument, a shifted one or a constant")

    # --- running ---

    def _run(self, compiled: _Compiled, using: str, values: dict) -> list:
        if compiled.sql is None:
            return []
        connection = connections[using]
        adapt = connection.ops.adapt_datetimefield_value
        params = []
        for param in compiled.params:
            if param[0] == "constant":
                params.append(param[1])
                continue
            kind, name, i, shift = param
            value = values[name] if i is None else values[name][i]
            params.append(int(value) if kind == "int" else adapt(value + shift))
        with connection.cursor() as cursor:
            cursor.execute(compiled.sql, params)
            rows = cursor.fetchall()
        compiler = compiled.compiler
        if compiled.instances:
            return list(_instances(compiler, rows, using))
        return list(compiler.results_iter(results=[rows], tuple_expected=True))


def _instances(compiler, rows: list, using: str):
    """Model instances as django.db.models.query.ModelIterable makes them."""
    select, klass_info, annotation_col_map = compiler.select, compiler.klass_info, compiler.annotation_col_map
    model = klass_info["model"]
    start, end = klass_info["select_fields"][0], klass_info["select_fields"][-1] + 1
    init_list = [column[0].target.attname for column in select[start:end]]
    populators = get_related_populators(klass_info, select, using)
    for row in compiler.results_iter(results=[rows]):
        instance = model.from_db(using, init_list, row[start:end])
        for populator in populators:
            populator.populate(row, instance)
        for name, position in (annotation_col_map or {}).items():
            setattr(instance, name, row[position])
        yield instance


def compiled_read(build: Callable) -> CompiledRead:
    """``build(**arguments)`` -> queryset, compiled once per database and shape of arguments;
    calling the result runs it with the values given and returns the list of its rows."""
    return CompiledRead(build)


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
