"""Code and data from object storage (``s3://``, ``gs://``, ``abfs://``, ``hdfs://``, ``http(s)://``, ``memory://``).

Through fsspec and its filesystem packages, installed as optional extras
(``pip install 'tfk8s-magics[storage]'``); a URL whose package is missing
is one sentence saying what to install.  :mod:`.urls` checks URLs (pure:
the spec uses it); :mod:`.transfer` fetches scripts and files, syncs a data
dir down and uploads checkpoints and models; ``python -m
tfk8s_magics.storage fetch URL DEST`` / ``upload SRC URL`` / ``fetch-models URL
DEST [--model M]`` does the same from a command line (the Kubernetes init
containers and upload step).
"""

from .transfer import Fetched, explain, fetch_models, fetch_text, open_fs, probe, sync_down, upload
from .urls import READ_ONLY, SCHEMES, check_url, is_url, join, scheme

__all__ = ["READ_ONLY", "SCHEMES", "Fetched", "check_url", "explain", "fetch_models", "fetch_text", "is_url",
           "join", "open_fs", "probe", "scheme", "sync_down", "upload"]
