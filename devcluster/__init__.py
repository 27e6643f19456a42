"""devcluster: a real Kubernetes for the test suite, built from Go modules and run as processes.

``scripts/kube up|down|env|status|build`` is the command line; :class:`devcluster.cluster.Cluster`
the Python side that tests use. See ``devcluster/README.md``.
"""
