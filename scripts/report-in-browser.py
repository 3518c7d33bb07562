#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Open a `noisyneighbor diagnose --html` report in headless Chromium: it renders, the browser's own
JSON.parse reads the embedded report, and a screenshot is written.

    scripts/report-in-browser.py --html report.html --screenshot report.png
    sudo scripts/report-in-browser.py --screenshot report.png      # makes a report first (root: BPF, cgroups)

Without --html it runs a real `diagnose` next to a latency-sensitive worker held at 0.2 cores by its
own CFS quota (it wants 0.3), in a cgroup it creates under its own (testkit.sandbox) and removes
at the end, so the page has an incident card and plots. Needs Debian's `chromium` package
(apt-get install chromium). Exit 0 when every check passed, 1 (one line on stderr) otherwise.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHECK_MARKER = "nn-browser-check"
# Appended to a copy of the report: the browser parses the embedded JSON and writes what it found
# into the DOM, which --dump-dom prints after scripts ran.
CHECK_SCRIPT = f"""<script>
(function () {{
  var out = document.createElement('pre'); out.id = '{CHECK_MARKER}';
  try {{
    var r = JSON.parse(document.getElementById('report').textContent);
    out.textContent = JSON.stringify({{ok: true, schema_version: r.schema_version, incidents: r.incidents.length,
      svgs: document.querySelectorAll('svg.chart').length,
      overflow: document.documentElement.scrollWidth > window.innerWidth}});
  }} catch (e) {{ out.textContent = JSON.stringify({{ok: false, error: String(e)}}); }}
  document.body.appendChild(out);
}})();
</script>"""


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    raise SystemExit("report-in-browser: no chromium found (apt-get install chromium)")


def browser(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
           "--window-size=900,1200", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def make_report(out: Path, seconds: int) -> None:
    sys.path.insert(0, str(REPO))
    from testkit.sandbox import OwnedCgroup

    config = out.with_suffix(".policy.yaml")
    config.write_text("slo: {runq_p99_ms: 2.0}\n")
    with OwnedCgroup("report-browser-ls", ("cpu",)) as cg:
        cg.write("cpu", "cpu.cfs_quota_us", "20000")
        worker = subprocess.Popen([sys.executable, str(REPO / "testkit" / "workloads" / "ls_worker.py"),
                                   "--seconds", str(seconds + 30)], preexec_fn=cg.preexec, stdout=subprocess.DEVNULL)
        try:
            rel = str(cg.dirs["cpu"].relative_to(cg.layout.hierarchy_for("cpu").mount))
            res = subprocess.run([sys.executable, "-m", "noisyneighbor.cli", "diagnose", "--duration", str(seconds),
                                  "--pods", "standalone", "--config", str(config), "--ls-cgroup", rel,
                                  "--html", str(out)], cwd=REPO, capture_output=True, text=True, timeout=seconds + 120)
        finally:
            worker.kill()
            worker.wait()
    config.unlink()
    if res.returncode not in (0, 3):
        raise SystemExit(f"report-in-browser: diagnose failed ({res.returncode}): {res.stderr.strip()[-300:]}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--html", type=Path, help="an existing report (default: run diagnose to make one)")
    p.add_argument("--screenshot", type=Path, default=Path("report.png"), help="where to write the PNG")
    p.add_argument("--seconds", type=int, default=15, help="diagnose duration when making a report")
    p.add_argument("--height", type=int, default=2400, help="screenshot height in pixels (full page if taller)")
    args = p.parse_args()

    with tempfile.TemporaryDirectory(prefix="nn-report-") as tmp:
        report = args.html or Path(tmp) / "report.html"
        if args.html is None:
            make_report(report, args.seconds)
        page = report.read_text(encoding="utf-8")
        checked = Path(tmp) / "checked.html"
        checked.write_text(page.replace("</body>", CHECK_SCRIPT + "</body>"), encoding="utf-8")
        dom = browser("--virtual-time-budget=2000", "--dump-dom", checked.as_uri())
        found = re.search(rf'<pre id="{CHECK_MARKER}">(.*?)</pre>', dom.stdout, re.S)
        if not found:
            print(f"report-in-browser: the page did not render ({dom.stderr.strip()[-200:]})", file=sys.stderr)
            return 1
        result = json.loads(found.group(1).replace("&quot;", '"'))
        shot = browser(f"--window-size=900,{args.height}", f"--screenshot={args.screenshot.resolve()}",
                       report.resolve().as_uri())
        if shot.returncode != 0 or not args.screenshot.exists():
            print(f"report-in-browser: no screenshot ({shot.stderr.strip()[-200:]})", file=sys.stderr)
            return 1
    print(json.dumps({**result, "screenshot": str(args.screenshot)}))
    if not result.get("ok"):
        print(f"report-in-browser: the browser could not parse the embedded JSON: {result.get('error')}", file=sys.stderr)
        return 1
    if result.get("overflow"):
        print("report-in-browser: the page is wider than the window (something does not wrap)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
