"""Opening a report page in Debian's headless Chromium, as a reader's browser would, and checking what it
shows: the tables in the DOM it built, and every image the page references decoding as a PNG.

Skipped, with the reason, only where Chromium is missing and GPUFRAC_REQUIRE_BROWSER is unset; `make test`
sets it (and installs Chromium with hack/ensure-chromium), so CI never skips it.
"""

from __future__ import annotations

import base64
import io
import os
import re
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from PIL import Image

CHROMIUM = Path("/usr/bin/chromium")


def require_chromium() -> Path:
    if not CHROMIUM.exists():
        if os.environ.get("GPUFRAC_REQUIRE_BROWSER"):
            pytest.fail(f"{CHROMIUM} is missing and GPUFRAC_REQUIRE_BROWSER is set: run hack/ensure-chromium")
        pytest.skip(f"{CHROMIUM} is missing (hack/ensure-chromium installs it; `make test` requires it)")
    return CHROMIUM


def dump_dom(page: Path, profile: Path) -> str:
    """The DOM Chromium built from `page`, after loading it."""
    command = [
        str(require_chromium()),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile}",
        "--dump-dom",
        page.resolve().as_uri(),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"chromium failed ({done.returncode}): {done.stderr[-2000:]}"
    return done.stdout


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tables: list[str] = []
        self.images: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "table":
            self.tables.append(found.get("id") or "")
        elif tag == "img":
            self.images.append(found.get("src") or "")


def check_page(page: Path, profile: Path, *, tables: set[str], images: int) -> str:
    """Open `page` in Chromium; assert its DOM has `tables` (by id) and `images` images, each of which
    exists (a data: URI or a file beside the page) and decodes as a PNG. Returns the DOM."""
    dom = dump_dom(page, profile)
    parsed = _Page()
    parsed.feed(dom)
    assert tables <= set(parsed.tables), parsed.tables
    assert len(parsed.images) == images, parsed.images
    for source in parsed.images:
        embedded = re.fullmatch(r"data:image/png;base64,(.+)", source, re.S)
        data = base64.b64decode(embedded.group(1)) if embedded else (page.parent / source).read_bytes()
        with Image.open(io.BytesIO(data)) as image:
            assert image.format == "PNG"
            image.load()
            assert image.width > 100 and image.height > 100
    return dom
