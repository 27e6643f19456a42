"""IPython profile of lab notebooks: every kernel starts with the tfk8s magics loaded.

The local lab profile copies this file into each user's IPYTHONDIR; the
notebook image installs it as a system-wide IPython config.

The extension is loaded by calling its ``load_ipython_extension`` (not through
``c.InteractiveShellApp.extensions``): IPython's extension manager then does not
know it is loaded, so the ``%load_ext tfk8s_magics`` that notebooks keep (to run
in any Jupyter) prints no "extension is already loaded"; the call is idempotent.
"""

c = get_config()  # noqa: F821 - provided by IPython when it loads this file
c.InteractiveShellApp.exec_lines = [
    "import tfk8s_magics as _tfk8s_magics; _tfk8s_magics.load_ipython_extension(get_ipython()); "
    "del _tfk8s_magics",
]
