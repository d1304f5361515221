"""The partition test over a matrix of configurations (``make partitions-matrix SECS=120
SEED=1``): run.py once per configuration, one after the other, with the same SECS, seed and
kinds of fault, then one table of every run's counts (check.matrix_table).

The configurations are min-replicas-to-write 0 and 1 times down-after-milliseconds 1000 and
3000 (``--configs 0:1000,1:3000`` runs a part of them). Each run writes its own folder under
the matrix's, target/partitions/<time>-matrix-seed<SEED>/min<N>-down<MS>/<time>-seed<SEED>/;
the table is matrix.md beside them. Arguments after ``--`` go to every run.py as they are.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import check

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CONFIGS = [(0, 1000), (0, 3000), (1, 1000), (1, 3000)]  # (min-replicas, down-after ms)


def parse_args() -> tuple[argparse.Namespace, list[str]]:
    argv = sys.argv[1:]
    rest = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--secs", type=float, default=float(os.environ.get("SECS") or 120))
    parser.add_argument("--seed", type=int, default=int(os.environ.get("SEED") or 1))
    parser.add_argument("--faults", default=os.environ.get("FAULTS") or "all",
                        help="passed to each run.py (default: all)")
    parser.add_argument("--configs", default=",".join(f"{m}:{d}" for m, d in CONFIGS),
                        help="min-replicas:down-after pairs, comma-separated")
    parser.add_argument("--out", default=str(ROOT / "target" / "partitions"))
    args = parser.parse_args(argv)
    try:
        args.configs = [(int(m), int(d)) for m, d in
                        (pair.split(":") for pair in args.configs.split(","))]
    except ValueError:
        parser.error(f"--configs {args.configs!r}: pairs like 0:1000,1:3000")
    return args, rest


def run_one(folder: Path, args: argparse.Namespace, min_replicas: int, down_after: int,
            rest: list[str]) -> dict[str, Any]:
    """One run.py; its summary.json with its exit status, or only the settings and the status
    when it wrote none."""
    folder.mkdir(parents=True)
    argv = [sys.executable, str(HERE / "run.py"), "--secs", f"{args.secs:g}",
            "--seed", str(args.seed), "--min-replicas", str(min_replicas),
            "--down-after", str(down_after), "--faults", args.faults, "--out", str(folder),
            *rest]
    status = subprocess.run(argv).returncode
    summaries = sorted(folder.glob("*/summary.json"))
    run: dict[str, Any] = (json.loads(summaries[-1].read_text()) if summaries else
                           {"min_replicas": min_replicas, "down_after": down_after})
    run["exit"] = status
    run["folder"] = str(summaries[-1].parent if summaries else folder)
    return run


def main() -> int:
    args, rest = parse_args()
    folder = Path(args.out) / time.strftime(f"%Y%m%d-%H%M%S-matrix-seed{args.seed}")
    runs = []
    try:
        for min_replicas, down_after in args.configs:
            print(f"matrix: min-replicas-to-write {min_replicas}, down-after-milliseconds "
                  f"{down_after}", flush=True)
            runs.append(run_one(folder / f"min{min_replicas}-down{down_after}", args,
                                min_replicas, down_after, rest))
    except KeyboardInterrupt:
        print("matrix: interrupted; the table has the runs that finished", file=sys.stderr)
    folder.mkdir(parents=True, exist_ok=True)
    table = (f"Partition matrix: SECS={args.secs:g} SEED={args.seed}, faults {args.faults}; "
             f"{len(runs)} of {len(args.configs)} configurations run.\n\n"
             + check.matrix_table(runs) + "\nRuns: "
             + ", ".join(f"{r['min_replicas']}/{r['down_after']} {r['folder']}" for r in runs)
             + "\n")
    (folder / "matrix.md").write_text(table)
    (folder / "matrix.json").write_text(json.dumps(runs, indent=1))
    print("\n" + table)
    statuses = {r["exit"] for r in runs}
    if len(runs) < len(args.configs) or statuses - {0, 1}:
        return 2
    return 1 if 1 in statuses else 0


if __name__ == "__main__":
    sys.exit(main())
