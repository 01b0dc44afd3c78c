"""What ``bench/storm.py --interruptible`` adds: an interruptible pool, preemptions in the simulator,
the same run on on-demand pods to compare with, and the section of output that compares them.

Not run on its own: storm.py calls these. The on-demand run is storm.py itself, in a process of its
own with the same arguments but ``--interruptible`` (and its own flags), run first, on its own
database (each run empties the database it is given), before this run starts its processes.

Preemptions at a realistic rate, honestly: the storm compresses a job into minutes (a pod boots in
6 + 3 s where a real one takes ~3 min), so 5 % of pods an hour on the simulator's clock never fires
in it (0.05 pod-hours). Two ways to have them, and the goals are judged only on a run that had one
(goal ``had_preemptions``):
- ``--time-scale K``: a second of the storm stands for K seconds of the real job; the simulator
  preempts at ``--preempt-rate`` × K per pod-hour of its clock (``--preempt-rate`` stays per real
  pod-hour). K = 20 makes the storm's boot a real one's 3 min, and a full-size storm (2–3 min of
  makespan) a job of about an hour;
- ``--preempt-share F``: F of the interruptible pods preempted by force at half the pages; on a job
  of about an hour, F of the pods an hour.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

DOLLARS_PER_PAGE_GOAL = 0.6  # × the on-demand run's
MAKESPAN_GOAL = 1.25  # × the on-demand run's
# Flags of the interruptible run only: the on-demand run is given every other argument.
OWN_FLAGS = {
    "--interruptible": 0,
    "--preempt-rate": 1,
    "--preempt-seed": 1,
    "--on-demand-floor": 1,
    "--bid-margin": 1,
    "--preempt-share": 1,
}
# --time-scale goes to both runs: it also divides --realistic's image pulls (the same in each run).


def add_flags(parser) -> None:
    parser.add_argument(
        "--interruptible", action="store_true",
        help="rent interruptible pods at a bid (on-demand above no floor), against the same run on on-demand pods",
    )  # fmt: skip
    parser.add_argument("--preempt-rate", type=float, default=0.05, help="preemptions per (real) pod-hour")
    parser.add_argument(
        "--time-scale", type=float, default=1.0,
        help="a storm second stands for this many real ones: the simulator preempts at the rate × this (20: boots)",
    )  # fmt: skip
    parser.add_argument("--preempt-seed", type=int, default=1, help="the simulator's preemption draws repeat with it")
    parser.add_argument("--on-demand-floor", type=int, default=0, help="on-demand pods kept below the interruptible")
    parser.add_argument("--bid-margin", default="0.01", help="$/h over the catalogue's minimum bid")
    parser.add_argument(
        "--preempt-share", type=float, default=0.0,
        help="once half the pages have ended, the provider takes back this share of the interruptible pods "
             "(at least one): a harsh market moment, whatever the rate",
    )  # fmt: skip


def sim_options(args) -> dict:
    if not args.interruptible:
        return {}
    return {"preempt_rate_per_hour": args.preempt_rate * args.time_scale, "preempt_seed": args.preempt_seed}


def pool_config(args, config: dict) -> dict:
    """The storm pool's config; with --interruptible its candidates are rented interruptible first,
    the same ones on demand after them (when no bid gets a pod, and for the floor)."""
    if not args.interruptible:
        return config
    spot = [{**group, "interruptible": True, "bid_margin": args.bid_margin} for group in config["candidates"]]
    return {**config, "candidates": spot + config["candidates"], "on_demand_floor": args.on_demand_floor}


def on_demand_argv(argv: list[str]) -> list[str]:
    """storm.py's arguments without the interruptible run's own flags."""
    kept, skip = [], 0
    for arg in argv:
        if skip:
            skip -= 1
            continue
        name = arg.split("=", 1)[0]
        if name in OWN_FLAGS:
            skip = OWN_FLAGS[name] if "=" not in arg else 0
            continue
        kept.append(arg)
    return kept


def on_demand_run(args, argv: list[str]) -> dict:
    """The same storm on on-demand pods, in a process of its own: its closing JSON line."""
    script = Path(__file__).resolve().parent / "storm.py"
    command = [sys.executable, str(script), *on_demand_argv(argv)]
    print(f"on-demand run first: {' '.join(command[1:])}", file=sys.stderr)
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=args.max_seconds * 2 + 600, env=dict(os.environ), check=False
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        raise SystemExit(f"the on-demand run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])


class MidRunPreemption:
    """--preempt-share: once half the storm's pages have ended, that share of its alive interruptible
    pods (rounded up) is preempted at once, through the simulator (``POST /sim/preempt``), as the
    provider would: the run then shows what losing them costs, whatever the rate's draws gave."""

    def __init__(self, args, sim_url: str) -> None:
        self.share, self.sim_url, self.done, self.preempted = args.preempt_share, sim_url, False, []

    def check(self, pods, ended: int, total: int) -> None:
        if self.done or not self.share or ended < total / 2:
            return
        import httpx

        self.done = True
        alive = list(pods.filter(interruptible=True, state="ready").exclude(provider_id="")
                     .values_list("provider_id", flat=True))  # fmt: skip
        for provider_id in alive[: max(1, math.ceil(self.share * len(alive)))] if alive else []:
            httpx.post(f"{self.sim_url}/sim/preempt", json={"pod_id": provider_id}, timeout=10).raise_for_status()
            self.preempted.append(provider_id)
        print(f"preempted {len(self.preempted)} of {len(alive)} interruptible pods at {ended}/{total} pages",
              file=sys.stderr)  # fmt: skip


def section(args, result: dict, pods, pages, sim_stats: dict, on_demand: dict | None) -> dict:
    """The interruptible run's figures beside the on-demand run's, and its goals (``pods`` and
    ``pages``: the storm's, the warm-up's left out)."""
    from django.db.models import Sum

    from ocrjobs.models import Page

    pods = pods.filter(billed_from__isnull=False)
    done = result["pages_by_status"].get(Page.Status.DONE, 0)
    per_page = result["dollars"] / done if done else None
    # attempts a preemption cost are given back (in attempts_given_back once the page was claimed again)
    attempts = pages.aggregate(n=Sum("attempts") - Sum("attempts_given_back"))["n"] or 0
    interruptible_hours = sum(
        ((pod.ended_at or pod.billed_from) - pod.billed_from).total_seconds() / 3600
        for pod in pods.filter(interruptible=True)
    )
    figures = {
        "preempt_rate_per_pod_hour": args.preempt_rate,
        "time_scale": args.time_scale,
        "preempt_seed": args.preempt_seed,
        "preempt_share_mid_run": args.preempt_share,
        "on_demand_floor": args.on_demand_floor,
        "pods_interruptible": pods.filter(interruptible=True).count(),
        "pods_on_demand": pods.filter(interruptible=False).count(),
        "interruptible_pod_hours": round(interruptible_hours, 3),
        "real_pod_hours": round(interruptible_hours * args.time_scale, 3),  # of the job the storm stands for
        "preemptions_expected": round(args.preempt_rate * args.time_scale * interruptible_hours, 3),
        "preemptions": pods.filter(preempted_at__isnull=False).count(),
        "preemptions_at_simulator": sim_stats.get("pods_preempted", 0),
        "pages_lost_in_flight": sim_stats.get("ocr_pages_lost_to_preemption", 0),
        "attempts_beyond_one_per_page": attempts - result["pages"],
        "dollars_per_page": round(per_page, 8) if per_page is not None else None,
    }
    goal = {
        "had_preemptions": figures["preemptions"] > 0,  # a run the rate left untouched proves nothing
        "nothing_lost": result["pages_lost"] == 0,
        "nothing_duplicated": result["ocr_forwards_beyond_pages_done"] <= 0,
        # Each pod the simulator took back is one preemption here, and nothing else is one (a pod
        # RunPod stopped for its image or its host is not: issue 39).
        "every_preemption_counted_once": figures["preemptions"] == figures["preemptions_at_simulator"],
    }
    if on_demand is not None:
        base_done = on_demand["pages_by_status"].get(Page.Status.DONE, 0)
        base_per_page = on_demand["dollars"] / base_done if base_done else None
        ratio = per_page / base_per_page if per_page is not None and base_per_page else None
        makespan = (
            result["makespan_s"] / on_demand["makespan_s"]
            if result["makespan_s"] and on_demand.get("makespan_s")
            else None
        )
        figures.update(
            on_demand_dollars_per_page=round(base_per_page, 8) if base_per_page is not None else None,
            on_demand_makespan_s=on_demand.get("makespan_s"),
            on_demand_pages_lost=on_demand["pages_lost"],
            dollars_per_page_ratio=round(ratio, 3) if ratio is not None else None,
            makespan_ratio=round(makespan, 3) if makespan is not None else None,
        )
        goal.update(
            dollars_per_page=ratio is not None and ratio <= DOLLARS_PER_PAGE_GOAL,
            makespan=makespan is not None and makespan <= MAKESPAN_GOAL,
        )
    figures["goal"] = goal
    figures["goal_met"] = all(goal.values())
    return figures


def print_section(figures: dict) -> None:
    print(f"interruptible        {figures['pods_interruptible']} interruptible pods, {figures['pods_on_demand']} on "
          f"demand (floor {figures['on_demand_floor']}); {figures['preemptions']} preemptions "
          f"({figures['preemptions_expected']} expected at {figures['preempt_rate_per_pod_hour']:g}/pod-hour over "
          f"{figures['interruptible_pod_hours']} pod-hours × {figures['time_scale']:g} = {figures['real_pod_hours']} "
          f"real; {figures['preempt_share_mid_run']:g} of the pods "
          f"preempted mid-run), {figures['pages_lost_in_flight']} pages lost in flight "
          f"and read again, {figures['attempts_beyond_one_per_page']} attempts beyond one a page")  # fmt: skip
    if "dollars_per_page_ratio" in figures:
        print(f"vs on-demand         ${figures['dollars_per_page']}/page against ${figures['on_demand_dollars_per_page']}"
              f"/page: {figures['dollars_per_page_ratio']} × (goal <= {DOLLARS_PER_PAGE_GOAL}); makespan "
              f"{figures['makespan_ratio']} × of {figures['on_demand_makespan_s']} s (goal <= {MAKESPAN_GOAL})")  # fmt: skip
    print(f"interruptible goals  {figures['goal']}")
