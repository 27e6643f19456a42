"""Code that runs inside every task (a local process or a pod)."""
