# SPDX-License-Identifier: Apache-2.0
"""Two scenario bench runs side by side (``--json`` results of ``python -m bench.scenarios``): per scenario
and mode, on which kernel and cgroup hierarchy each ran, detected / cause / culprit rank in each, whether
they agree, and how many incidents the victim had from the onset (one per continuous antagonist: the
detector's open/close hysteresis holds it open).

    python -m bench.scenarios.compare HOST.json VM.json [--only cpu-neighbor self-throttle ...] [--mode detect]
"""

from __future__ import annotations

import argparse
import json
import sys


def _where(meta: dict) -> str:
    cgroup = meta.get("cgroup", "?")
    return f"{meta.get('kernel', '?')}, cgroup {cgroup}{', VM' if meta.get('vm') else ''}, {meta.get('cpus', '?')} CPUs"


def _victim_incidents(p: dict) -> int:
    """Incidents of the scenario's victim pod that were open at or after the onset."""
    from bench.scenarios.catalog import SCENARIOS

    victim = next((s.truth.victim for s in SCENARIOS if s.name == p["scenario"]), None) or "web"
    return sum(1 for i in p["incidents"] if i["victim"] == victim and (i["ended_s"] is None or i["ended_s"] >= 0))


def rows(a: dict, b: dict, only: set[str] | None, mode: str | None) -> list[dict]:
    def passes(doc: dict) -> dict[tuple[str, str], dict]:
        return {(p["scenario"], p["mode"]): p for p in doc["passes"] if p.get("repeat", 0) == 0}

    pa, pb = passes(a), passes(b)
    out = []
    for key in [k for k in pb if k in pa]:
        scenario, m = key
        if (only and scenario not in only) or (mode and m != mode):
            continue
        sa, sb = pa[key]["score"], pb[key]["score"]
        same = all(sa[f] == sb[f] for f in ("detected", "cause", "culprit_rank"))
        out.append({"scenario": scenario, "mode": m, "expected": sb["expected"],
                    "a": (sa["detected"], sa["cause"], sa["culprit_rank"], _victim_incidents(pa[key])),
                    "b": (sb["detected"], sb["cause"], sb["culprit_rank"], _victim_incidents(pb[key])),
                    "b_p99_ms": (sb["p99_before_ms"], sb["p99_during_ms"]), "same": same,
                    "skipped": pb[key].get("skipped", "")})
    return out


def render(a: dict, b: dict, table: list[dict]) -> str:
    def cell(t: tuple) -> str:
        detected, cause, rank, incidents = t
        return f"{'yes' if detected else '-' if detected is None else 'no'} | {cause or '-'} | " \
               f"{rank if rank is not None else '-'} | {incidents}"

    lines = [f"A: {_where(a['meta'])}: `{a['meta'].get('command', '?')}`",
             f"B: {_where(b['meta'])}: `{b['meta'].get('command', '?')}`", "",
             "| scenario | mode | expected | A detected | A cause | A culprit rank | A victim incidents "
             "| B detected | B cause | B culprit rank | B victim incidents | B p99 before / during ms | same |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        p99 = " / ".join("-" if v is None else f"{v:.2f}" for v in r["b_p99_ms"])
        lines.append(f"| {r['scenario']} | {r['mode']} | {r['expected']} | {cell(r['a'])} | {cell(r['b'])} | {p99} | "
                     f"{'yes' if r['same'] else 'NO'}{' (' + r['skipped'] + ')' if r['skipped'] else ''} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a", help="first run's --json (e.g. the host)")
    p.add_argument("b", help="second run's --json (e.g. the VM lane)")
    p.add_argument("--only", nargs="+", metavar="NAME")
    p.add_argument("--mode", default="detect")
    args = p.parse_args(argv)
    try:
        with open(args.a, encoding="utf-8") as f:
            a = json.load(f)
        with open(args.b, encoding="utf-8") as f:
            b = json.load(f)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(render(a, b, rows(a, b, set(args.only) if args.only else None, args.mode)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
