"""Small filters for the dashboard's numbers: durations, money, rates."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from django import template
from django.utils import timezone

register = template.Library()


@register.filter
def duration(seconds: float | None) -> str:
    """45s, 3m 20s, 2h 05m, 3d 04h."""
    if seconds is None or seconds == "":
        return "—"
    seconds = max(0, int(float(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours:02d}h"


@register.filter
def coarse(seconds: float | None) -> str:
    """A duration that changes at most once a minute: the dashboard is re-sent only when it changes."""
    if seconds is None or seconds == "":
        return "—"
    seconds = max(0, int(float(seconds)))
    if seconds < 60:
        return "<1m"
    if seconds < 3600:
        return f"{seconds // 60}m"
    return duration(seconds)


@register.filter
def ago(moment: datetime | None) -> str:
    if moment is None:
        return "—"
    return coarse((timezone.now() - moment).total_seconds())


@register.filter
def when(moment: datetime | None) -> str:
    """A time of day today, with the date before today: it does not change while it is shown."""
    if moment is None:
        return "—"
    local = timezone.localtime(moment)
    if local.date() == timezone.localdate():
        return local.strftime("%H:%M:%S")
    return local.strftime("%b %d %H:%M")


@register.filter
def money(value: Decimal | float | None) -> str:
    """Dollars: cents above a dollar, four places below it (a page costs fractions of a cent)."""
    if value is None or value == "":
        return "—"
    value = float(value)
    if value == 0:
        return "$0"
    if abs(value) >= 1:
        return f"${value:,.2f}"
    return f"${value:.4f}"


@register.filter
def seconds(value: float | None) -> str:
    """A loop lag: milliseconds under a second, seconds above."""
    if value is None or value == "":
        return "—"
    value = float(value)
    if value < 1:
        return f"{value * 1000:.0f} ms"
    return f"{value:.2f} s"


@register.filter
def points(pairs: list[tuple[float, float]]) -> str:
    """An SVG points attribute from (x, y) numbers."""
    return " ".join(f"{x:g},{y:g}" for x, y in pairs)


@register.filter
def about_minutes(minutes: float | None) -> str:
    """A forecast's minutes in words: "under a minute", "about 2 minutes", "about 1 hour 20 minutes"."""
    if minutes is None or minutes == "":
        return "—"
    whole = round(float(minutes))
    if float(minutes) < 1:
        return "under a minute"
    if whole < 60:
        return f"about {whole} minute{'s' if whole != 1 else ''}"
    hours, rest = divmod(whole, 60)
    said = f"about {hours} hour{'s' if hours != 1 else ''}"
    return f"{said} {rest} minute{'s' if rest != 1 else ''}" if rest and hours < 10 else said


@register.filter
def dollars_words(value: Decimal | float | None) -> str:
    """A forecast's dollars for people: "no charge", "under $0.01", "$0.42", "$12"."""
    if value is None or value == "":
        return "price unknown"
    value = float(value)
    if value == 0:
        return "no charge"
    if value < 0.01:
        return "under $0.01"
    if value < 100:
        return f"${value:,.2f}"
    return f"${value:,.0f}"
