"""Serving what a cluster trained: TensorFlow Serving's REST and gRPC APIs.

* On Kubernetes: a Deployment + Service of the official ``tensorflow/serving``
  image reading the cluster's ``/log`` claim (:mod:`.kubernetes`).
* On the local backend: a TensorFlow-Serving-compatible server in a process
  on 127.0.0.1 (:mod:`.server`), tied to its owner's life like TensorBoard
  (:mod:`.local`).  It is a compatible endpoint, not the TF Serving binary.

Models live where the Trainer exports them: ``<log dir>/models/<model>/<version>``.
"""

from __future__ import annotations

from dataclasses import dataclass

#: What other packages use; the servers and model loading are internal.
__all__ = ["MODELS_SUBDIR", "ServingInfo"]

#: Where exported models live under a cluster's log dir.
MODELS_SUBDIR = "models"


@dataclass(frozen=True)
class ServingInfo:
    """A model being served: where to reach it and which version answers.

    ``rest_url`` is what a browser or notebook uses (through
    jupyter-server-proxy when the lab sets ``TENSORBOARD_PROXY_URL``, or the
    Service behind the hub's login on Kubernetes); ``rest_local`` and
    ``grpc_address`` are what code in the notebook's own network dials.
    """

    cluster: str
    model: str
    version: int | None
    rest_url: str
    rest_local: str
    grpc_address: str
    base_path: str
    reused: bool = False
    pid: int | None = None
    replicas: int = 1

    def predict_url(self, local: bool = True) -> str:
        """The ``:predict`` URL of the served model (latest version)."""
        base = self.rest_local if local else self.rest_url
        return f"{base.rstrip('/')}/v1/models/{self.model}:predict"
