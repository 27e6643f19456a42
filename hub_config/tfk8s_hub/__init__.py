"""JupyterHub configuration of the tfk8s lab.

* :mod:`.settings` -- the administrator's settings (:class:`~.settings.LabSettings`).
* :mod:`.bootstrap` -- pure builders of each user namespace's objects.
* :mod:`.spawner` -- the Kubernetes profile: KubeSpawner settings and hooks.
* :mod:`.hub` -- the hub's own endpoints and login inside Kubernetes.
* :mod:`.local` -- the one-machine profile (local processes, no Kubernetes).
"""
