"""Prints the real-node fault suite's table (docs/faults.md) from build/fault-report.json,
which tests/e2e/test_real_faults.py writes: `make test-faults`, then this."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPORT = Path(__file__).resolve().parents[1] / "build" / "fault-report.json"
HEADER = (
    "| Fault | Goal | Fault lasted | Requests sent | Failed | Last failure after the fault's start (end) "
    "| Status wrong for at most | Status unreadable | Goal met |\n"
    "|---|---|---|---|---|---|---|---|---|"
)


def table(report: dict) -> str:
    lines = [HEADER]
    for r in report["rows"]:
        lines.append(
            f"| {r['fault']} | {r['goal']} | {r['lasted_s']:g} s | {r['sent']} | {r['failed']} "
            f"| {r['recovered_s']:g} s ({r['served_again_s']:g} s) | {r['status_lag_s']:g} s "
            f"| {r['status_unreadable_s']:g} s | {'yes' if r['met'] else 'no'} |"
        )
    return "\n".join(lines)


def said(report: dict) -> str:
    out = []
    for r in report["rows"]:
        if r["status_said"]:
            out.append(f"- {r['fault']}: " + "; ".join(f"`{' / '.join(s.split(chr(10)))}`" for s in r["status_said"][:3]))
    return "\n".join(out)


def main() -> int:
    if not REPORT.exists():
        print(f"{REPORT} does not exist: run make test-faults first", file=sys.stderr)
        return 1
    report = json.loads(REPORT.read_text())
    print(f"Measured {report['date']} (`make test-faults`, then `python cluster/fault_table.py`):\n")
    print(table(report))
    print("\nWhat the status said while not Ready:\n")
    print(said(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
