"""The Kubernetes notebook is the lab's notebook: the notebook image's JupyterLab in a real browser.

A new user on Kubernetes saw JupyterLab's news pop-up, the kernel "Python 3 (ipykernel)" and no
``examples/`` folder: the image carried none of the lab's JupyterLab settings. Here the image
runs under podman as KubeSpawner runs it (its own user, an empty home, the image's own
configuration) and Chromium opens it: no news pop-up, ``examples/`` holds the example notebooks,
each opens on the lab's kernel with no dialog and nothing changed, and a new notebook starts that
kernel without asking.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path

import pytest
import requests

from tests.browserlab import chromium, shot, wait
from tests.test_browser_walk import _dirty_tabs, _kernel_idle
from tests.test_containers import images, pods  # noqa: F401, F811  (fixtures: this tree's images, a PodmanRun)

pytestmark = [pytest.mark.containers, pytest.mark.browser]

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = sorted(p.name for p in (REPO / "notebooks").glob("*.ipynb"))
KERNEL = json.loads((REPO / "images" / "notebook" / "kernel" / "kernel.json").read_text())["display_name"]


@pytest.fixture
def notebook_image(request) -> str:
    """The notebook image under test: ``$TFK8S_NOTEBOOK_IMAGE``, else the one built from this tree."""
    return os.environ.get("TFK8S_NOTEBOOK_IMAGE") or request.getfixturevalue("images")["notebook"]


def test_the_notebook_image_is_the_labs_jupyterlab(notebook_image, pods, tmp_path):  # noqa: F811
    from tests.test_containers import build_flags
    from tfk8s_magics.ports import free_port

    port, token = free_port(), secrets.token_hex(16)
    name = f"{pods.prefix}-notebook"
    # As KubeSpawner starts it: the image's user, an empty home volume of theirs, its own config.
    home = tmp_path / "home"
    home.mkdir()
    os.chown(home, 1000, 100)
    pods.run("run", "--detach", "--name", name, "--label", f"tfk8s.test-run={pods.prefix}",
             *build_flags(), "-v", f"{home}:/home/jovyan",
             "--publish", f"127.0.0.1:{port}:8888", notebook_image,
             "jupyter", "lab", "--ip=0.0.0.0", "--port=8888", "--no-browser",
             f"--IdentityProvider.token={token}")
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        try:
            if requests.get(f"{url}/api/status", params={"token": token}, timeout=5).ok:
                break
        except requests.ConnectionError:
            pass
        assert time.monotonic() < deadline, pods.logs(name)[-3000:]
        time.sleep(0.5)
    listing = requests.get(f"{url}/api/contents/examples", params={"token": token}, timeout=30)
    assert listing.status_code == 200, (listing.status_code, pods.logs(name)[-2000:])
    assert sorted(c["name"] for c in listing.json()["content"]) == EXAMPLES
    for nb in EXAMPLES:  # the shipped notebooks in the user's own volume, with the kernel's metadata
        copy = json.loads((home / "examples" / nb).read_text())
        assert copy["cells"] == json.loads((REPO / "notebooks" / nb).read_text())["cells"]
        assert copy["metadata"]["kernelspec"]["display_name"] == KERNEL
    specs = requests.get(f"{url}/api/kernelspecs", params={"token": token}, timeout=30).json()
    assert specs["default"] == "python3" and list(specs["kernelspecs"]) == ["python3"], specs
    assert specs["kernelspecs"]["python3"]["spec"]["display_name"] == KERNEL

    with chromium(tmp_path / "chromium-profile") as page:
        for nb in EXAMPLES:
            before = requests.get(f"{url}/api/contents/examples/{nb}", params={"token": token},
                                  timeout=30).json()["last_modified"]
            page.goto(f"{url}/lab/tree/examples/{nb}?token={token}")
            wait(lambda: _kernel_idle(page, KERNEL), 180, f"{nb}'s kernel", page, "nbimage-")
            time.sleep(2)  # kernel info and metadata updates arrive just after "Idle"
            assert page.locator(".jp-Dialog").count() == 0, (nb, page.locator(".jp-Dialog").inner_text())
            assert _dirty_tabs(page) == [], (nb, _dirty_tabs(page))
            after = requests.get(f"{url}/api/contents/examples/{nb}", params={"token": token},
                                 timeout=30).json()["last_modified"]
            assert after == before, nb
        # A new notebook: the lab's kernel starts, no dialog asks which.
        page.locator(".lm-MenuBar-itemLabel", has_text="File").click()
        page.locator(".lm-Menu-itemLabel", has_text="New").first.hover()
        page.locator('.lm-Menu-item[data-command="notebook:create-new"]').click()
        wait(lambda: "Untitled" in page.locator(".lm-DockPanel-tabBar .lm-mod-current").inner_text(), 60,
             "the new notebook", page, "nbimage-")
        wait(lambda: _kernel_idle(page, KERNEL), 180, "the new notebook's kernel", page, "nbimage-")
        assert page.locator(".jp-Dialog").count() == 0, page.locator(".jp-Dialog").inner_text()
        # No news pop-up (nor an update check) was shown at any point.
        toasts = page.locator(".Toastify__toast").all_inner_texts()
        assert not [t for t in toasts if "news" in t.lower() or "update" in t.lower()], toasts
        shot(page, "notebook-image-lab.png")
        assert page.dialogs == []  # type: ignore[attr-defined]
