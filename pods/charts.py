"""The dashboard's figures over time: pages/s and $/h for each minute of the last hour, and
what each pool has spent since midnight.

Pods are summed in SQL, grouped by the minutes at which their billing starts and ends within
the hour: a few rows whatever the size of the fleet (a row per pod would be 500 rows at 500 pods,
their datetimes parsed in Python, at every push). Pages are counted per minute in SQL too.
"""

from __future__ import annotations

import math
import threading
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.db import connection
from django.utils import timezone

from pods import hooks

CHART_MINUTES = 60
CHART_WIDTH = 600
CHART_HEIGHT = 100


# Raw SQL, one statement per database: these reads run every second, and Django compiling the
# same nest of Greatest/Least/Coalesce each time cost more than SQLite running it (5 ms vs 0.5).
_SQL = {
    "sqlite": {"epoch": "((julianday({}) - 2440587.5) * 86400.0)", "minute": "CAST(({}) / 60.0 AS integer)",
               "greatest": "MAX", "least": "MIN"},
    "postgresql": {"epoch": "date_part('epoch', {})",  # a double (EXTRACT's numeric is slower)
                   "minute": "CAST(FLOOR(({}) / 60.0) AS integer)", "greatest": "GREATEST", "least": "LEAST"},
}  # fmt: skip


def billed(*, since: datetime, first: datetime, now: datetime) -> tuple[dict[str, Decimal], list[float]]:
    """What the pods billed, in one grouped read: ({pool key: dollars since ``since``}, [$/h x
    seconds billed in each minute from ``first`` to ``now``]); ``since`` and ``first`` fall on
    minutes.

    SQL sums each pool's pods by the minutes their billing starts and ends in (price, and price
    x start and x end in seconds since 1970): a few rows whatever the fleet. Pods of one such
    group all start, and all end, on the same side of any minute, so each group is clamped to
    the window here. A pod adds its price to the chart's minutes it covers whole through a
    running sum, and its share to the two minutes at its ends."""
    sql = _SQL[connection.vendor]
    epoch, least, minute = sql["epoch"].format, sql["least"], sql["minute"].format
    # The pods alive or ended within the window, found through the ended_at index (live ones
    # have none), not every pod ever made: 20,000 ended pods cost 37 ms on SQLite, 18 on PostgreSQL.
    pods = (
        f"SELECT CAST(p.cost_per_hr AS double precision) AS cost, p.pool_id AS pool, {epoch('p.billed_from')} AS b, "
        f"{least}(COALESCE({epoch('p.ended_at')}, %(now)s), %(now)s) AS x FROM pods_pod p "
        f"WHERE (p.ended_at IS NULL OR p.ended_at > %(lo_at)s) AND p.billed_from IS NOT NULL AND p.billed_from < %(now_at)s"
    )
    grouped = (
        f"SELECT pool, bm, xm, SUM(cost) AS price, SUM(cost * b) AS at_b, SUM(cost * x) AS at_x "
        f"FROM (SELECT cost, pool, b, x, {minute('b')} AS bm, {minute('x')} AS xm FROM ({pods}) w) m GROUP BY pool, bm, xm"
    )
    query = f"SELECT k.key, g.bm, g.xm, g.price, g.at_b, g.at_x FROM ({grouped}) g JOIN pods_pool k ON k.id = g.pool"
    adapt = connection.ops.adapt_datetimefield_value
    with connection.cursor() as cursor:
        cursor.execute(query, {"now": now.timestamp(), "now_at": adapt(now), "lo_at": adapt(min(since, first))})
        rows = cursor.fetchall()
    since_e, first_e = since.timestamp(), first.timestamp()
    first_minute = round(first_e / 60)
    spend: dict[str, float] = {}
    partial = [0.0] * CHART_MINUTES
    steps = [0.0] * (CHART_MINUTES + 1)
    for pool, bm, xm, price, at_b, at_x in rows:
        bm, xm, price, at_b, at_x = int(bm), int(xm), float(price or 0), float(at_b or 0), float(at_x or 0)
        if xm * 60 >= since_e:  # billed since ``since``, from its start or from ``since``
            spend[pool] = spend.get(pool, 0.0) + at_x - (at_b if bm * 60 >= since_e else price * since_e)
        if not price or xm * 60 < first_e:
            continue
        at_start = at_b - price * first_e if bm * 60 >= first_e else 0.0  # price x seconds from first
        at_end = at_x - price * first_e
        i = min(max(bm - first_minute, 0), CHART_MINUTES - 1)
        j = min(xm - first_minute, CHART_MINUTES - 1)
        if i == j:
            partial[i] += at_end - at_start
            continue
        partial[i] += price * 60 * (i + 1) - at_start
        partial[j] += at_end - price * 60 * j
        steps[i + 1] += price
        steps[j] -= price
    running, per_minute = 0.0, []
    for i in range(CHART_MINUTES):
        running += steps[i]
        per_minute.append(partial[i] + running * 60)
    return {pool: Decimal(str(round(ds, 6))) / 3600 for pool, ds in spend.items()}, per_minute


# Pages are counted per minute of the last hour once a minute is this far behind (a page's
# finished_at is the moment its result is stored, committed at once); until then at every push.
SETTLED_AFTER = timedelta(minutes=2)
# The last minutes are counted one by one (pages_done_in_minutes) up to so many; more, grouped.
COUNTED_ONE_BY_ONE = 5
_settled: dict[tuple[str, datetime], int] = {}  # (database, minute) -> pages done in it
_settled_lock = threading.Lock()


def forget_settled() -> None:
    """Drop the kept counts of settled minutes (tests; a process's first push in the bench)."""
    with _settled_lock:
        _settled.clear()


def pages_by_minute(first: datetime, now: datetime, *, keep: bool) -> dict[datetime, int]:
    """{minute (UTC): pages done in it} from ``first`` to ``now``. With ``keep`` (the
    broadcaster, every second), minutes settled earlier are not counted again: a push reads the
    last couple of minutes' pages, not the hour's."""
    if not keep:
        return hooks.jobs().pages_done_by_minute(since=first)
    database = connection.settings_dict["NAME"]
    settled_until = now.replace(second=0, microsecond=0) - SETTLED_AFTER
    settled = []
    minute = first
    while minute < settled_until:
        settled.append(minute)
        minute += timedelta(minutes=1)
    with _settled_lock:
        known = {m: _settled[(database, m)] for m in settled if (database, m) in _settled}
    since = next((m for m in settled if m not in known), settled_until)
    unsettled = []
    while since + timedelta(minutes=len(unsettled)) <= now:
        unsettled.append(since + timedelta(minutes=len(unsettled)))
    if len(unsettled) <= COUNTED_ONE_BY_ONE:
        counted = hooks.jobs().pages_done_in_minutes(unsettled)
    else:  # (the first push, or one after a pause)
        counted = hooks.jobs().pages_done_by_minute(since=since)
    with _settled_lock:
        for m in settled:
            if m >= since:
                _settled[(database, m)] = counted.get(m, 0)
        for key in [key for key in _settled if key[1] < first]:
            del _settled[key]
    return {**known, **counted}


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


def chart_start(now: datetime) -> datetime:
    return now.replace(second=0, microsecond=0) - timedelta(minutes=CHART_MINUTES - 1)


def charts(now: datetime, dollar_seconds: list[float], *, dollars_now: float, keep: bool = False) -> dict:
    """pages/s and $/h for each minute of the last hour, the current minute prorated, from
    ``billed``'s dollar-seconds of each minute since ``chart_start(now)``; the $/h of the current
    minute is ``dollars_now``, what the pods billed now cost (the burn-rate card's figure: as
    the minute's average it read $0.09/h beside a card at $0/h once a pod was released).
    ``keep``: the counts of settled minutes are kept from one call to the next
    (``pages_by_minute``)."""
    current = now.replace(second=0, microsecond=0)
    minutes = [current - timedelta(minutes=CHART_MINUTES - 1 - i) for i in range(CHART_MINUTES)]
    done = pages_by_minute(minutes[0].astimezone(UTC), now, keep=keep)
    pages, dollars, labels = [], [], []
    for start in minutes:
        end = min(start + timedelta(minutes=1), now)
        seconds = (end - start).total_seconds()
        # a minute a few milliseconds old has too few pages to make a rate of; a second is the floor
        pages.append(done.get(start.astimezone(UTC), 0) / max(1.0, seconds))
        if start == current:
            dollars.append(float(dollars_now))
        else:
            dollars.append(dollar_seconds[len(labels)] / seconds)
        labels.append(timezone.localtime(start).strftime("%H:%M"))
    return {
        "pages": _chart(pages, labels, "pages/s", 2),
        "dollars": _chart(dollars, labels, "$/h", 2),
        "start_label": labels[0],
        "end_label": "now",
    }
