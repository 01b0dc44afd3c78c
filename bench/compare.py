"""Compare: one benchmark on a worktree of REF and on the working tree, alternating (invariant 18).

    .venv/bin/python bench/compare.py REF [--rounds 3] -- bench/<name>.py [its arguments]
    .venv/bin/python bench/compare.py main -- bench/ingest.py --pdfs 20

Checks REF out into a git worktree of its own in a temporary directory, then runs the benchmark's
command line (what follows ``--``) there and in the working tree, ``--rounds`` times each, the two
sides alternating and the order swapped every round (REF first, then the working tree first), so
that a neighbour's load, or the machine warming, falls on both alike. Both sides run with this
Python (the current venv); each from its own tree, so each runs its own code. The worktree is
removed when it exits, whatever happens.

Each run's closing JSON line is read, and every numeric figure in it (nested ones by a dotted path,
``fleet_push.push_median_ms``; lists by index) is printed with its values on each side, their
medians and the ratio: working tree ÷ REF. Read the CPU figures first
(``control_plane_cpu_ms_per_page`` and its kind: bench/_cpu.py): the machine's load barely moves
them, as it moves wall time and rates.
Ends with one JSON line of its own: the figures, and a "goal" with every_run_ended (each run exited
0 and ended with a JSON line).

Run it for any change on the path of a page (submission, split, dispatch, results) against
``main``, at a size where the figure is steady, and put its ratios in the commit.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SIDES = ("ref", "work")


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """compare.py's own options, and the benchmark's command line (after ``--``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], usage="%(prog)s REF [--rounds N] -- COMMAND")
    parser.add_argument("ref", help="a commit, branch or tag to compare the working tree with")
    parser.add_argument("--rounds", type=int, default=3, help="runs on each side (default 3)")
    if "--" not in argv:
        parser.error("the benchmark's command line goes after --: bench/compare.py main -- bench/ingest.py")
    split = argv.index("--")
    args, command = parser.parse_args(argv[:split]), argv[split + 1 :]
    if not command:
        parser.error("no benchmark given after --")
    if args.rounds < 1:
        parser.error("--rounds is at least 1")
    return args, command


def git(*args: str, cwd: Path = REPO) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def figures_of(value, prefix: str = "") -> dict[str, float]:
    """Every number in a benchmark's JSON by its dotted path; not the verdicts (booleans)."""
    found: dict[str, float] = {}
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = ((str(n), item) for n, item in enumerate(value))
    else:
        return {prefix: value} if isinstance(value, int | float) and not isinstance(value, bool) else {}
    for key, item in items:
        if not prefix and key in ("goal", "goal_met"):
            continue
        found.update(figures_of(item, f"{prefix}.{key}" if prefix else key))
    return found


def run_once(root: Path, command: list[str]) -> tuple[dict | None, float, str]:
    """The benchmark run from ``root``: its JSON line (None if it failed), seconds, what it said."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, *command], cwd=root, capture_output=True, text=True)
    seconds = time.monotonic() - started
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    said = "\n".join([*lines[-20:], *done.stderr.splitlines()[-20:]])
    if done.returncode != 0 or not lines:
        return None, seconds, f"exited {done.returncode}:\n{said}"
    try:
        result = json.loads(lines[-1])
    except json.JSONDecodeError:
        return None, seconds, f"did not end with a JSON line:\n{said}"
    return (result, seconds, "") if isinstance(result, dict) else (None, seconds, f"ended with {lines[-1][:200]}")


def median(values: list[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


def compare(runs: dict[str, list[dict]]) -> dict[str, dict]:
    """Per figure (in the order the benchmark prints them): each side's values, medians, the ratio."""
    names: dict[str, None] = {}
    per_run = {side: [figures_of(result) for result in results] for side, results in runs.items()}
    for side in SIDES:
        for figures in per_run[side]:
            names.update(dict.fromkeys(figures))
    table = {}
    for name in names:
        row: dict = {side: [figures.get(name) for figures in per_run[side]] for side in SIDES}
        row["ref_median"], row["work_median"] = median(row["ref"]), median(row["work"])
        both = row["ref_median"] is not None and row["work_median"] is not None
        row["ratio"] = round(row["work_median"] / row["ref_median"], 3) if both and row["ref_median"] else None
        table[name] = row
    return table


def show(number: float | None) -> str:
    return "-" if number is None else f"{number:.4g}"


def main() -> None:
    args, command = parse(sys.argv[1:])
    script = command[0]
    if not (REPO / script).is_file():
        raise SystemExit(f"{script}: no such benchmark in the working tree (a path from the repository's root)")
    ref_commit = git("rev-parse", "--verify", f"{args.ref}^{{commit}}")
    work_commit = git("rev-parse", "HEAD") + (
        "+changes" if git("status", "--porcelain", "--untracked-files=no") else ""
    )
    temp = Path(tempfile.mkdtemp(prefix="fleetadmin-compare-"))
    ref_root = temp / "ref"
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    seconds: dict[str, list[float]] = {side: [] for side in SIDES}
    failures: list[str] = []
    try:
        git("worktree", "add", "--detach", str(ref_root), ref_commit)
        if not (ref_root / script).is_file():
            raise SystemExit(f"{script} is not in {args.ref} ({ref_commit[:10]})")
        roots = {"ref": ref_root, "work": REPO}
        # A fresh worktree has no bytecode: its first run compiled every module it imported (7.4 s
        # against 4.1 s for bench/dispatch.py --lease-only). Both trees are compiled first.
        for root in roots.values():
            subprocess.run([sys.executable, "-m", "compileall", "-q", str(root)], cwd=root, capture_output=True)
        for number in range(args.rounds):
            # Swapped each round: a drift in the machine's load (or its warming) falls on both sides.
            for side in SIDES if number % 2 == 0 else SIDES[::-1]:
                print(f"round {number + 1}/{args.rounds}: {side} ...", file=sys.stderr, flush=True)
                result, took, said = run_once(roots[side], command)
                seconds[side].append(round(took, 1))
                if result is None:
                    failures.append(f"{side}, round {number + 1}: {said}")
                    print(f"{side}, round {number + 1}: {said}", file=sys.stderr)
                else:
                    runs[side].append(result)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(ref_root)], cwd=REPO, capture_output=True)
        shutil.rmtree(temp, ignore_errors=True)
        subprocess.run(["git", "worktree", "prune"], cwd=REPO, capture_output=True)

    table = compare(runs)
    print(f"{' '.join(command)}: {args.rounds} rounds each, alternating; ref {args.ref} ({ref_commit[:10]}), "
          f"work {work_commit[:10]}{'+changes' if work_commit.endswith('+changes') else ''}")  # fmt: skip
    header = ("figure", "ref", "median", "work", "median", "work÷ref")
    lines = [header] + [
        (name, " ".join(map(show, row["ref"])), show(row["ref_median"]), " ".join(map(show, row["work"])),
         show(row["work_median"]), show(row["ratio"]))
        for name, row in table.items()
    ]  # fmt: skip
    widths = [max(len(line[column]) for line in lines) for column in range(len(header))]
    for line in lines:
        cells = (f"{cell:>{width}}" for cell, width in zip(line[1:], widths[1:], strict=True))
        print(f"{line[0]:{widths[0]}}  " + "  ".join(cells))
    for side in SIDES:
        met = [result.get("goal_met") for result in runs[side]]
        print(f"{side}: goal_met {met}, seconds a run {seconds[side]}")
    goal = {"every_run_ended": not failures and all(len(runs[side]) == args.rounds for side in SIDES)}
    print(json.dumps({"benchmark": "compare", "ref": args.ref, "ref_commit": ref_commit, "work_commit": work_commit,
                      "command": command, "rounds": args.rounds, "worktree": str(ref_root),
                      "goal_met_by_side": {side: [r.get("goal_met") for r in runs[side]] for side in SIDES},
                      "seconds": seconds, "figures": table, "failures": failures, "goal": goal,
                      "goal_met": all(goal.values())}))  # fmt: skip


if __name__ == "__main__":
    main()
