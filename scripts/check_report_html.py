"""Open a ``kvtier report --html`` page in headless Chromium: it must load with no script
error and draw every chart it carries; optionally save a screenshot.

    python scripts/check_report_html.py REPORT.html [--screenshot OUT.png] [--height PX]

Chromium is the distribution's package (Debian: ``apt-get install chromium``). The page is
copied beside a probe: a script first in ``<head>`` records every error (uncaught exceptions,
failed promises, ``console.error``), and one at the end of ``<body>`` counts, once the page
has loaded, the charts drawn (plotly divs whose SVG holds at least one trace) against the
number the page declares (``<body data-charts>``). Chromium runs with networking off, so a
page that needed the network would fail here. Prints one JSON object; exit code 1 when a
check fails, 2 when Chromium is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-extensions",
    "--hide-scrollbars",
]

HEAD_PROBE = """<script>
window.__errors = [];
window.addEventListener("error", function (e) { window.__errors.push("error: " + e.message); });
window.addEventListener("unhandledrejection", function (e) {
  window.__errors.push("rejection: " + String(e.reason)); });
(function () { var ce = console.error; console.error = function () {
  window.__errors.push("console.error: " + Array.prototype.join.call(arguments, " "));
  return ce.apply(console, arguments); }; })();
</script>"""

BODY_PROBE = """<script>
window.addEventListener("load", function () { setTimeout(function () {
  var plots = document.querySelectorAll(".js-plotly-plot");
  var drawn = 0;
  plots.forEach(function (p) {
    if (p.querySelector(".main-svg") && p.querySelectorAll(".trace").length > 0) drawn++;
  });
  var out = document.createElement("pre");
  out.id = "kvtier-probe";
  out.textContent = JSON.stringify({
    declared: Number(document.body.dataset.charts || -1), plots: plots.length,
    drawn: drawn, errors: window.__errors, plotly: typeof window.Plotly });
  document.body.appendChild(out);
}, 1000); });
</script>"""


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def probe(page: Path, browser: str, timeout: float = 180.0) -> dict:
    """Load ``page`` (with the probes) in headless Chromium; the probe's findings."""
    text = page.read_text(encoding="utf-8")
    text = text.replace("<head>", "<head>" + HEAD_PROBE, 1)
    text = text.replace("</body>", BODY_PROBE + "</body>", 1)
    with tempfile.TemporaryDirectory() as tmp:
        probed = Path(tmp) / "probed.html"
        probed.write_text(text, encoding="utf-8")
        cmd = [
            browser,
            *FLAGS,
            f"--user-data-dir={tmp}/profile",
            "--virtual-time-budget=20000",
            "--dump-dom",
            probed.as_uri(),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    found = re.search(r'<pre id="kvtier-probe">(.*?)</pre>', proc.stdout, re.S)
    if not found:
        return {"loaded": False, "stderr": proc.stderr[-2000:], "returncode": proc.returncode}
    import html

    return {"loaded": True, **json.loads(html.unescape(found.group(1)))}


def screenshot(page: Path, out: Path, browser: str, height: int, timeout: float = 180.0) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            browser,
            *FLAGS,
            f"--user-data-dir={tmp}/profile",
            "--virtual-time-budget=20000",
            f"--window-size=1280,{height}",
            f"--screenshot={out.resolve()}",
            page.resolve().as_uri(),
        ]
        subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True)


def check(found: dict) -> list[str]:
    """What is wrong with a probe's findings (empty: the page passed)."""
    if not found.get("loaded"):
        return ["the page did not finish loading (no probe output)"]
    problems = [f"script error: {e}" for e in found["errors"]]
    if found["plotly"] != "object":
        problems.append("plotly.js is not loaded")
    if found["declared"] < 1:
        problems.append("the page declares no chart")
    if found["drawn"] != found["declared"] or found["plots"] != found["declared"]:
        problems.append(
            f"{found['drawn']} charts drawn of {found['plots']} plot divs, "
            f"{found['declared']} declared"
        )
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("page", type=Path)
    ap.add_argument("--screenshot", type=Path, default=None)
    ap.add_argument("--height", type=int, default=2200, help="screenshot height in pixels")
    args = ap.parse_args(argv)
    browser = chromium()
    if browser is None:
        print("chromium is not installed (apt-get install chromium)", file=sys.stderr)
        return 2
    found = probe(args.page, browser)
    problems = check(found)
    if args.screenshot is not None and not problems:
        screenshot(args.page, args.screenshot, browser, args.height)
    version = subprocess.run(
        [browser, "--version"], capture_output=True, text=True, env={**os.environ}
    ).stdout.strip()
    print(json.dumps({"chromium": version, **found, "problems": problems}, indent=2))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
