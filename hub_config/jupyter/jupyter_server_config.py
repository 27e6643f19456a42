"""The lab's JupyterLab defaults (read by every user's server: this folder is on JUPYTER_CONFIG_PATH).

``lab/settings/overrides.json`` beside this file is JupyterLab's documented way to change a
setting's default (a user can still change it in Settings): no news pop-up and no update check
(they would reach the internet), and a new notebook starts the lab's kernel without asking.
"""

from pathlib import Path

c = get_config()  # noqa: F821 - defined by Jupyter when it loads this file
c.LabApp.app_settings_dir = str(Path(__file__).resolve().parent / "lab" / "settings")
# The server never fetches the news feed or checks for updates either, whatever a user sets.
c.LabApp.news_url = None
c.LabApp.check_for_updates_class = "jupyterlab.NeverCheckForUpdate"
