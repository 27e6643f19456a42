"""Issue 27 in a real browser (JupyterLab + Debian's Chromium), the lab as a new user gets it.

* the lab's JupyterLab settings: no news pop-up, a new notebook starts the lab's kernel with no
  kernel-selection dialog, and the example notebooks (the copies a new user gets) open
  unmodified;
* the "final state" record is no second copy under a live dashboard.
"""

from __future__ import annotations

import json
import sys
import time

import pytest

from tests.browserlab import REPO, Lab, chromium, run_cell, shot, wait

sys.path.insert(0, str(REPO / "hub_config"))
from tfk8s_hub.local import prepare_user  # noqa: E402

pytestmark = pytest.mark.browser

EXAMPLES = sorted(p.name for p in (REPO / "notebooks").glob("*.ipynb"))


@pytest.fixture
def home(tmp_path):
    """A new user's home as the lab makes it (the example notebooks copied in ``examples/``)."""
    return prepare_user(tmp_path / "lab", "demo")["home"]


@pytest.fixture
def lab(tmp_path, state_dir, home):
    server = Lab(tmp_path, state_dir, home)
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def page(tmp_path):
    with chromium(tmp_path / "chromium-profile") as pg:
        yield pg


def _dirty_tabs(page) -> list[str]:
    return [t.inner_text() for t in page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.jp-mod-dirty").all()]


def _kernel_idle(page, name: str) -> bool:
    bar = page.locator("#jp-main-statusbar").inner_text()
    return "Idle" in bar and name in bar


def test_the_labs_jupyterlab_settings(lab, page, home):
    """No news pop-up; a new notebook gets the lab's kernel without a dialog; the examples open
    unmodified (the kernel they start rewrites none of their metadata)."""
    spec = json.loads((REPO / "hub_config" / "jupyter" / "kernels" / "python3" / "kernel.json").read_text())
    kernel_name = spec["display_name"]
    # Each example, opened as a new user opens it: nothing changed, nothing to save (checked
    # before the next one: a page with unsaved changes would hold the navigation).
    for name in EXAMPLES:
        before = (home / "examples" / name).read_bytes()
        page.goto(f"{lab.base}/lab/tree/examples/{name}?token={lab.token}")
        wait(lambda: _kernel_idle(page, kernel_name), 120, f"{name}'s kernel", page)
        time.sleep(2)  # kernel info and metadata updates arrive just after "Idle"
        assert page.locator(".jp-Dialog").count() == 0, (name, page.locator(".jp-Dialog").inner_text())
        assert _dirty_tabs(page) == [], (name, _dirty_tabs(page))
        assert (home / "examples" / name).read_bytes() == before

    # No news pop-up (nor an update check) since the lab opened (JupyterLab asks at once).
    assert not [t for t in page.locator(".Toastify__toast").all_inner_texts()
                if "news" in t.lower() or "update" in t.lower()]

    # A new notebook (File > New > Notebook): the lab's kernel starts, no dialog asks which.
    page.locator(".lm-MenuBar-itemLabel", has_text="File").click()
    page.locator(".lm-Menu-itemLabel", has_text="New").first.hover()
    page.locator('.lm-Menu-item[data-command="notebook:create-new"]').click()
    wait(lambda: "Untitled" in page.locator(".lm-DockPanel-tabBar .lm-mod-current").inner_text(), 60,
         "the new notebook", page)
    wait(lambda: _kernel_idle(page, kernel_name), 120, "the new notebook's kernel", page)
    assert page.locator(".jp-Dialog").count() == 0, page.locator(".jp-Dialog").inner_text()

    # No news pop-up (nor an update check) was shown at any point.
    toasts = page.locator(".Toastify__toast").all_inner_texts()
    assert not [t for t in toasts if "news" in t.lower() or "update" in t.lower()], toasts
    shot(page, "lab-settings.png")
    assert page.dialogs == []  # type: ignore[attr-defined]
