"""The dashboard's figures over time: pages/s and $/h for each minute of the last hour, and
what each pool has spent since midnight.

Pods are summed in SQL, grouped by the minutes at which their billing starts and ends within
the hour: a few rows whatever the size of the fleet (500 pods used to cost 500 rows, their
datetimes parsed in Python, at every push). Pages are counted per minute in SQL too.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.db import connection
from django.db.models import Q, Sum
from django.utils import timezone

from ocrjobs.selectors import pages_done_by_minute
from pods.models import Pod

CHART_MINUTES = 60
CHART_WIDTH = 600
CHART_HEIGHT = 100


# Raw SQL, one statement per database: these reads run every second, and Django compiling the
# same nest of Greatest/Least/Coalesce each time cost more than SQLite running it (5 ms vs 0.5).
_SQL = {
    "sqlite": {"epoch": "((julianday({}) - 2440587.5) * 86400.0)", "minute": "CAST(({}) / 60.0 AS integer)",
               "greatest": "MAX", "least": "MIN"},
    "postgresql": {"epoch": "CAST(EXTRACT(EPOCH FROM {}) AS double precision)",
                   "minute": "CAST(FLOOR(({}) / 60.0) AS integer)", "greatest": "GREATEST", "least": "LEAST"},
}  # fmt: skip


def _billed_between(lo: datetime, hi: datetime, select: str, group: str) -> list[tuple]:
    """``select``/``group`` over the pods billed at some moment in [lo, hi), each with ``cost``
    ($/h), ``s`` and ``e``: the seconds from ``lo`` at which its billing starts and ends,
    clamped to the window."""
    sql = _SQL[connection.vendor]
    epoch = sql["epoch"].format
    window = (
        f"SELECT p.cost_per_hr AS cost, k.key AS pool, "
        f"{sql['greatest']}({epoch('p.billed_from')} - %s, 0.0) AS s, "
        f"{sql['least']}(COALESCE({epoch('p.ended_at')}, %s) - %s, %s) AS e "
        f"FROM pods_pod p JOIN pods_pool k ON k.id = p.pool_id "
        f"WHERE p.billed_from IS NOT NULL AND p.billed_from < %s AND (p.ended_at IS NULL OR p.ended_at > %s)"
    )
    first, last = (f"{sql['least']}({sql['minute'].format(end)}, {CHART_MINUTES - 1})" for end in ("s", "e"))
    query = (
        f"SELECT {select} FROM (SELECT w.*, {first} AS i, {last} AS j FROM ({window}) w WHERE e > s) b GROUP BY {group}"
    )
    adapt = connection.ops.adapt_datetimefield_value
    lo_e, hi_e = lo.timestamp(), hi.timestamp()
    with connection.cursor() as cursor:
        cursor.execute(query, [lo_e, hi_e, lo_e, hi_e - lo_e, adapt(hi), adapt(lo)])
        return cursor.fetchall()


def spend_since_by_pool(since: datetime, now: datetime) -> dict[str, Decimal]:
    """{pool key: dollars} its pods billed between ``since`` and ``now``, in one grouped query."""
    rows = _billed_between(since, now, "pool, SUM(cost * (e - s))", "pool")
    return {key: Decimal(str(round(float(ds or 0.0), 6))) / 3600 for key, ds in rows}


def dollar_seconds_by_minute(first: datetime, now: datetime) -> list[float]:
    """$/h x seconds billed in each minute from ``first`` to ``now``. A pod adds its price to the
    minutes it covers whole through a running sum, and its share to the two minutes at its ends;
    pods that start and end in the same two minutes are summed together in SQL."""
    rows = _billed_between(first, now, "i, j, SUM(cost), SUM(cost * s), SUM(cost * e)", "i, j")
    partial = [0.0] * CHART_MINUTES
    steps = [0.0] * (CHART_MINUTES + 1)
    for i, j, price, at_start, at_end in rows:
        i, j, price, at_start, at_end = int(i), int(j), float(price), float(at_start), float(at_end)
        if i == j:
            partial[i] += at_end - at_start
            continue
        partial[i] += price * 60 * (i + 1) - at_start
        partial[j] += at_end - price * 60 * j
        steps[i + 1] += price
        steps[j] -= price
    running, result = 0.0, []
    for i in range(CHART_MINUTES):
        running += steps[i]
        result.append(partial[i] + running * 60)
    return result


def dollars_per_hour_at(moment: datetime) -> float:
    """What the pods billed at ``moment`` cost per hour."""
    billed = Pod.objects.filter(billed_from__lte=moment).filter(Q(ended_at__isnull=True) | Q(ended_at__gt=moment))
    return float(billed.aggregate(total=Sum("cost_per_hr"))["total"] or 0)


def _nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 5 x 10^k at or above value: a round top for a chart's axis."""
    if value <= 0:
        return 1.0
    exponent = math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        top = step * 10**exponent
        if top >= value - 1e-12:
            return float(top)
    return float(10 ** (exponent + 1))


def _chart(values: list[float], labels: list[str], unit: str, decimals: int) -> dict:
    """Bars and a step line in a 600x100 box, computed here; the template draws them."""
    top = _nice_ceiling(max(values, default=0.0))
    step = CHART_WIDTH / max(1, len(values))
    bars, line = [], []
    for i, (value, label) in enumerate(zip(values, labels, strict=True)):
        height = round(value / top * (CHART_HEIGHT - 4), 2)
        y = round(CHART_HEIGHT - height, 2)
        bars.append({"x": round(i * step, 2), "y": y, "h": height, "w": round(step - 1, 2), "title": label,
                     "value": round(value, decimals)})  # fmt: skip
        line += [(round(i * step, 2), y), (round((i + 1) * step, 2), y)]
    return {
        "bars": bars,
        "line": line,
        "top": round(top, decimals),
        "current": round(values[-1], decimals) if values else 0,
        "peak": round(max(values, default=0.0), decimals),
        "unit": unit,
        "width": CHART_WIDTH,
        "height": CHART_HEIGHT,
    }


def charts(now: datetime) -> dict:
    """pages/s and $/h for each minute of the last hour, the current minute prorated."""
    current = now.replace(second=0, microsecond=0)
    minutes = [current - timedelta(minutes=CHART_MINUTES - 1 - i) for i in range(CHART_MINUTES)]
    dollar_seconds = dollar_seconds_by_minute(minutes[0], now)
    pages_by_minute = pages_done_by_minute(since=minutes[0])
    pages, dollars, labels = [], [], []
    for start in minutes:
        end = min(start + timedelta(minutes=1), now)
        seconds = (end - start).total_seconds()
        # a minute a few milliseconds old has too few pages to make a rate of; a second is the floor
        pages.append(pages_by_minute.get(start.astimezone(UTC), 0) / max(1.0, seconds))
        if seconds > 0:
            dollars.append(dollar_seconds[len(labels)] / seconds)
        else:  # the minute begins now: what the pods billed now cost per hour
            dollars.append(dollars_per_hour_at(now))
        labels.append(timezone.localtime(start).strftime("%H:%M"))
    return {
        "pages": _chart(pages, labels, "pages/s", 2),
        "dollars": _chart(dollars, labels, "$/h", 2),
        "start_label": labels[0],
        "end_label": "now",
    }
