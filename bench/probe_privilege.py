"""Issue 19's privilege and file-safety probe: every attack of tests/integration/
privilege_scenarios.py, run for real (root's CLI, uid 65534, a seteuid'd root job, device nodes,
a full or read-only /tmp, user namespaces), each scenario in a private mount namespace; prints
tried/held per class. Needs root, setpriv and unshare.

    .venv/bin/python bench/probe_privilege.py [--src OTHER/src] [--json] [SCENARIO...]

``--src`` probes another source tree (e.g. main's, extracted with `git archive`) with the same
attacks, to compare before and after.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "integration"))

import privilege_scenarios  # noqa: E402

CLASSES = {
    "privilege": ["mixed_uid_socket", "planted_staged_code", "tampered_copy"],
    "file safety": ["atomic_write_symlink_race", "out_dir_not_chowned",
                    "report_onto_device_node", "artefact_swapped_for_symlink"],
    "tracebacks": ["odd_names", "deep_staging_tree", "full_tmp", "readonly_tmp",
                   "user_namespace_target"],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="*", help="only these (default: all)")
    parser.add_argument("--src", help="the flight_profiler source tree to probe")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: dict[str, dict[str, Any]] = {}
    for cls, names in CLASSES.items():
        for name in names:
            if args.scenarios and name not in args.scenarios:
                continue
            started = time.monotonic()
            try:
                result = privilege_scenarios.run_private(name, src=args.src)
            except Exception as exc:  # a scenario that could not run counts as all failed
                result = {"tried": 1, "held": 0, "notes": [f"FAILED: did not run: {exc}"[:500]]}
            result["class"] = cls
            result["seconds"] = round(time.monotonic() - started, 1)
            results[name] = result
            if not args.json:
                print(f"{cls:12} {name:30} {result['held']:>3}/{result['tried']:<3} held "
                      f"({result['seconds']} s)", flush=True)
                for note in result["notes"]:
                    if str(note).startswith("FAILED"):
                        print(f"{'':14}{str(note)[:200]}", flush=True)
    totals = {cls: [sum(r["tried"] for r in results.values() if r["class"] == cls),
                    sum(r["held"] for r in results.values() if r["class"] == cls)]
              for cls in CLASSES}
    if args.json:
        print(json.dumps({"scenarios": results, "classes": totals}))
    else:
        for cls, (tried, held) in totals.items():
            if tried:
                print(f"{cls}: {held}/{tried} held")
    return 0 if all(held == tried for tried, held in totals.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
