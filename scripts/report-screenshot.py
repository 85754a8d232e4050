#!/usr/bin/env python3
"""A PNG of one drawn case of a report.html, as headless Chromium renders it
(the same browser session the suite's test uses: tests/fixtures/browser.py).

    .venv/bin/python scripts/report-screenshot.py REPORT_DIR OUT.png [FIGURE_ID]

FIGURE_ID defaults to the first torn transaction's picture
(draw-torn-transaction-1). The PNG is reduced to 48 colours: the diagrams
are flat, and docs/ keeps it small. docs/analysis.md shows the demo's.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from PIL import Image

from tests.fixtures.browser import render_page


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    report_dir, out = Path(argv[0]), Path(argv[1])
    figure = argv[2] if len(argv) == 3 else "draw-torn-transaction-1"
    page = render_page(report_dir / "report.html", clip_selector=f"#{figure}")
    if page.errors:
        print("the page reported errors:\n  " + "\n  ".join(page.errors), file=sys.stderr)
        return 1
    image = Image.open(io.BytesIO(page.png)).convert("RGB")
    image.quantize(colors=48, method=Image.Quantize.MEDIANCUT).save(out, optimize=True)
    print(f"{out}: {image.width}x{image.height}, {out.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
