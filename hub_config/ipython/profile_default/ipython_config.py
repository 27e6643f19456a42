"""IPython profile of lab notebooks: every kernel starts with the tfk8s magics loaded.

The local lab profile copies this file into each user's IPYTHONDIR; the
notebook image installs it as a system-wide IPython config.
"""

c = get_config()  # noqa: F821 - provided by IPython when it loads this file
c.InteractiveShellApp.extensions = ["tfk8s_magics"]
