"""bench/storm.py's forecasts against the bill (issue 26, item 4).

Each job's forecast is the one the product made at its submission (``Job.forecast``, written by
``job_submit``; the stored-pages mode makes it the same way, ``record_forecasts``, before any
work), read for the job's priority as the job page shows it beside the actual figures
(``ocrjobs.live.forecast_vs_actual``). The actual figures are that page's: minutes from the
job's creation to its end (the database's clock: the simulator's boots and pages take real
seconds) and dollars from the spend accounting (``pods.spend.jobs_spend``: the job's share of its
pods, price per lane-second × the seconds its pages held a lane). The error is forecast ÷ actual
- 1. The storm's whole spend (boots and idle tails too, the pool's) is set beside the sum of the
jobs' forecast dollars.
"""

from __future__ import annotations

import time

FORECAST_GOAL = 0.25  # |forecast ÷ actual - 1|, dollars and minutes (issue 26)
BASIS = (
    "seconds_per_page",
    "boot_seconds",
    "boot_wait_seconds",
    "idle_seconds",
    "price_per_pod_hour",
    "pages_ahead",
    "pages_behind",
)


def record_forecasts(job_ids: list[int], *, workers, provider: str = "runpod") -> None:
    """Submit the stored jobs once the workers are up (a user's job never waits for them to
    start: 14 s of the first --small run's 70): each job's forecast as ``job_submit`` makes it
    (its pages, its pool first, every pool open to the deployment) and its creation time, before
    any page of it is read. First the price catalogue is stored,
    as a deployment that has booted before has it (the first boot reuses it within its TTL): a
    fresh database has none, and the forecast's dollars would be "price unknown"."""
    from django.utils import timezone

    from ocrjobs.models import Job, Page
    from pods import capacity
    from pods.models import Pool
    from pods.services import forecast
    from pods.services.forecast import job_forecast, pool_forecast

    wait_for_workers(workers)
    capacity.catalogue_get(provider)
    forecast._bases.clear()  # the pool's figures as they are now (a warm-up has just measured them)

    for job in Job.objects.filter(pk__in=job_ids).select_related("pool").order_by("pk"):
        pages = Page.objects.filter(job=job).count()
        job.forecast = job_forecast(pages=pages, pool=job.pool, pools=Pool.objects.open_to(None))
        # Its pages are stored already: they are its own, not ahead of it. Those ahead are the
        # jobs' submitted before it (pages are read in the order they came); those of the jobs
        # submitted after it in the same burst are behind it. The storm's jobs come as one burst,
        # so each is forecast as the burst stands once it is in (as a forecast made again then
        # would be): the scaler sizes the pool for every page of it, the first job's too.
        waiting = Page.objects.filter(pool=job.pool).waiting()
        ahead = waiting.filter(job_id__lt=job.pk).count()
        behind = waiting.filter(job_id__gt=job.pk).count()
        job.forecast["pools"][0] = pool_forecast(job.pool, pages=pages, ahead=ahead, behind=behind)
        job.created_at = timezone.now()
        job.save(update_fields=["forecast", "created_at"])


def warm_up(pool, job_id: int, *, workers, tick_seconds: float, max_seconds: float) -> dict:
    """Run the warm-up job (a user's earlier job on the pool) to its end and until the pool's pods
    are shed: the storm's jobs are then forecast, as on a deployment in use, on what the pool has
    measured (seconds a page, boots, prices, preemptions) rather than the settings' guesses. Its
    own forecast, made on a fresh pool, is the guess set beside them. Returns its check."""
    from ocrjobs.models import Page
    from pods.enqueue import nudge_scaler
    from pods.models import Pod

    record_forecasts([job_id], workers=workers)
    started = last_nudge = time.monotonic()
    nudge_scaler(pool.pk)
    pages = Page.objects.filter(job_id=job_id)
    alive = Pod.objects.filter(pool=pool, state__in=Pod.ALIVE_STATES)
    while pages.exclude(status__in=Page.FINISHED).exists() or alive.exists():
        if not workers.alive():
            raise SystemExit(f"the workers exited:\n{workers.tail()}")
        if time.monotonic() - started > max_seconds:
            raise SystemExit(f"the warm-up job did not end (pods shed) within {max_seconds:.0f} s")
        if tick_seconds and time.monotonic() - last_nudge >= tick_seconds:
            nudge_scaler(pool.pk)
            last_nudge = time.monotonic()
        time.sleep(1.0)
    from pods.spend import spend_report

    return forecast_vs_bill([job_id], spend_total=spend_report()["total"])


def wait_for_workers(workers, *, deadline_s: float = 120.0) -> None:
    """Until every django-q2 cluster that ``manage.py workers`` started says it is running."""
    end = time.monotonic() + deadline_s
    while True:
        log = workers.log_path.read_text(errors="replace")
        clusters = log.count(" workers started (cluster pid ")
        if clusters and log.count("] running.") >= clusters:
            return
        if not workers.alive():
            raise SystemExit(f"the workers exited:\n{workers.tail()}")
        if time.monotonic() > end:
            raise SystemExit(f"the workers' clusters did not all start within {deadline_s:.0f} s")
        time.sleep(0.5)


def _error(forecast: float | None, actual: float | None) -> float | None:
    if forecast is None or not actual:
        return None
    return round(forecast / actual - 1, 3)


def forecast_vs_bill(job_ids: list[int], *, spend_total: float) -> dict:
    """Per job: the forecast (its priority's sizing), the actual pods, minutes and dollars, and
    each error; then the worst errors and the storm's whole spend against the forecasts' sum."""
    from ocrjobs.live import forecast_vs_actual
    from ocrjobs.models import Job
    from pods.services import forecast as forecasts
    from pods.spend import jobs_spend

    forecasts._bases.clear()  # the pool's measurements as they are now, for the forecasts made again

    # A job's bill: its share (the job page's figure) plus the pool's boots and idle tails in
    # proportion to it (the storm's pool serves only its jobs: the bills add up to the spend).
    shares = {job_id: float(dollars) for job_id, dollars in jobs_spend(job_ids).items()}
    overhead = spend_total / sum(shares.values()) if sum(shares.values()) else None
    jobs = []
    for job in Job.objects.filter(pk__in=job_ids).select_related("pool").order_by("pk"):
        shown = forecast_vs_actual(job, job.page_counts()) or {}
        forecast = shown.get("forecast") or {}
        bill = round(shares.get(job.pk, 0.0) * overhead, 4) if overhead is not None else None
        based = ((job.forecast or {}).get("pools") or [{}])[0].get("based_on", {})
        jobs.append({
            "job": job.pk,
            "pages": shown.get("pages_forecast"),
            "sizing": shown.get("sizing"),
            "forecast": {"pods": forecast.get("pods"), "minutes": forecast.get("minutes"),
                         "dollars": forecast.get("dollars")},
            "actual": {"pods": shown.get("pods"), "minutes": shown.get("minutes"), "dollars": bill,
                       "job_page_dollars": round(shares.get(job.pk, 0.0), 4)},
            "error": {"minutes": _error(forecast.get("minutes"), shown.get("minutes")),
                      "dollars": _error(forecast.get("dollars"), bill)},
            "based_on": {k: based.get(k) for k in BASIS},
        })  # fmt: skip
        # Which term was off: the same job forecast again on what the pool has measured since.
        again = forecasts.pool_forecast(job.pool, pages=shown.get("pages_forecast") or 0,
                                        ahead=based.get("pages_ahead") or 0,
                                        behind=based.get("pages_behind") or 0)  # fmt: skip
        sizing = again["sizings"].get(job.priority) or again["sizings"]["balanced"]
        jobs[-1]["measured"] = {
            "forecast": sizing,
            "error": {"minutes": _error(sizing["minutes"], shown.get("minutes")),
                      "dollars": _error(sizing["dollars"], bill)},
            "based_on": {k: again["based_on"].get(k) for k in BASIS},
        }  # fmt: skip

    def worst(kind: str, measured: bool = False) -> float | None:
        rows = [row["measured"] if measured else row for row in jobs]
        errors = [abs(row["error"][kind]) for row in rows if row["error"][kind] is not None]
        return max(errors) if len(errors) == len(jobs) and jobs else None

    forecast_dollars = [row["forecast"]["dollars"] for row in jobs]
    remeasured = _forecast_on_what_was_measured(job_ids, spend_total) if jobs else None
    forecast_sum = sum(forecast_dollars) if jobs and None not in forecast_dollars else None
    return {
        "jobs": jobs,
        "worst_minutes_error": worst("minutes"),
        "worst_dollars_error": worst("dollars"),
        "worst_minutes_error_measured": worst("minutes", measured=True),
        "worst_dollars_error_measured": worst("dollars", measured=True),
        "forecast_dollars_sum": round(forecast_sum, 4) if forecast_sum is not None else None,
        "spend_total": round(spend_total, 4),
        "spend_total_error": _error(forecast_sum, spend_total),
        "whole_storm_on_measured_basis": remeasured,
    }


def _forecast_on_what_was_measured(job_ids: list[int], spend_total: float) -> dict:
    """Which term was off: the storm's pages as one job, forecast again now that the pool has
    measured its pages, boots and price, against the whole storm (first submission to last end,
    every pod's bill)."""
    from django.db.models import Max, Min

    from ocrjobs.models import Job, Page
    from pods.services import forecast

    jobs = Job.objects.filter(pk__in=job_ids)
    span = jobs.aggregate(first=Min("created_at"), last=Max("finished_at"))
    pool = jobs.select_related("pool").first().pool
    again = forecast.pool_forecast(pool, pages=Page.objects.filter(job_id__in=job_ids).count())
    sizing = again["sizings"]["balanced"]
    minutes = (span["last"] - span["first"]).total_seconds() / 60 if span["last"] else None
    pods = Page.objects.filter(job_id__in=job_ids).exclude(pod=None).values("pod").distinct().count()
    return {
        "based_on": {k: again["based_on"].get(k) for k in BASIS},
        "forecast": sizing,
        "actual": {"pods": pods, "minutes": round(minutes, 2) if minutes else None, "dollars": round(spend_total, 4)},
        "error": {"minutes": _error(sizing["minutes"], minutes), "dollars": _error(sizing["dollars"], spend_total)},
    }


def within_goal(check: dict) -> dict[str, bool]:
    """The goals: every job's forecast within FORECAST_GOAL of its minutes and of its dollars."""
    return {
        f"forecast_{kind}_within_25_pct": check[f"worst_{kind}_error"] is not None
        and check[f"worst_{kind}_error"] <= FORECAST_GOAL
        for kind in ("minutes", "dollars")
    }


def print_forecast_vs_bill(check: dict) -> None:
    print(
        "forecast vs actual   pods        minutes               dollars                  (error: forecast ÷ actual - 1)"
    )
    for row in check["jobs"]:
        f, a, e = row["forecast"], row["actual"], row["error"]
        print(f"  job {row['job']:<5} {row['sizing']:9} {f['pods']} vs {a['pods']:<3} "
              f"{f['minutes']} vs {a['minutes']} ({_pct(e['minutes'])})   "
              f"${f['dollars']} vs ${a['dollars']} ({_pct(e['dollars'])})   based on {row['based_on']}")  # fmt: skip
    print(f"  worst error: minutes {_pct(check['worst_minutes_error'])}, dollars {_pct(check['worst_dollars_error'])}; "
          f"the storm's whole spend ${check['spend_total']} against the forecasts' sum "
          f"${check['forecast_dollars_sum']} ({_pct(check['spend_total_error'])})  goal within {FORECAST_GOAL:.0%}")  # fmt: skip
    print(f"  forecast again on what the pool measured since (which term was off): worst error minutes "
          f"{_pct(check['worst_minutes_error_measured'])}, dollars {_pct(check['worst_dollars_error_measured'])}")  # fmt: skip
    for row in check["jobs"]:
        f, e = row["measured"]["forecast"], row["measured"]["error"]
        print(f"  job {row['job']:<5} {f['pods']} pods, {f['minutes']} min ({_pct(e['minutes'])}), "
              f"${f['dollars']} ({_pct(e['dollars'])})   based on {row['measured']['based_on']}")  # fmt: skip
    again = check["whole_storm_on_measured_basis"]
    if again:
        f, a, e = again["forecast"], again["actual"], again["error"]
        print(f"  every page as one job, forecast again on what the pool measured {again['based_on']}: "
              f"{f['pods']} vs {a['pods']} pods, {f['minutes']} vs {a['minutes']} min ({_pct(e['minutes'])}), "
              f"${f['dollars']} vs ${a['dollars']} ({_pct(e['dollars'])})")  # fmt: skip


def print_warm_up(check: dict | None) -> None:
    if not check:
        print("warm-up              none: the storm's jobs were forecast on a fresh pool (the settings' guesses)")
        return
    row = check["jobs"][0]
    f, a, e = row["forecast"], row["actual"], row["error"]
    print(f"warm-up job {row['job']}       {row['pages']} pages on a fresh pool, forecast on guesses (not a goal): "
          f"{f['minutes']} vs {a['minutes']} min ({_pct(e['minutes'])}), ${f['dollars']} vs ${a['dollars']} "
          f"({_pct(e['dollars'])})   based on {row['based_on']}")  # fmt: skip


def _pct(error: float | None) -> str:
    return "n/a" if error is None else f"{error:+.0%}"
