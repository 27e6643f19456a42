"""TF_CONFIG generation ("autospec"): the user never writes a ClusterSpec.

Pure functions.  A backend says where each task listens (``address_of``);
these functions turn a :class:`~tfk8s_magics.spec.ClusterSpec` into the
``cluster`` dict TensorFlow expects and one TF_CONFIG per task.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from .spec import IN_GRAPH, ClusterSpec, Task

Addresses = dict[str, list[str]]


def cluster_def(spec: ClusterSpec, address_of: Callable[[Task], str]) -> Addresses:
    """The ``cluster`` part of TF_CONFIG: role → list of ``host:port``.

    For an in-graph cluster the chief is left out: the notebook kernel
    becomes the chief when it connects (:func:`coordinator_cluster_def`),
    and the servers never dial it.
    """
    out: Addresses = {}
    for task in spec.tasks():
        out.setdefault(task.role, []).append(address_of(task))
    return out


def tf_config(cluster: Addresses, task: Task) -> str:
    """The TF_CONFIG JSON for one task of ``cluster``."""
    return json.dumps(
        {"cluster": cluster, "task": {"type": task.role, "index": task.index}},
        sort_keys=True,
    )


def coordinator_cluster_def(spec: ClusterSpec, cluster: Addresses, chief: str) -> Addresses:
    """The cluster as the in-graph client sees it: the servers plus itself as chief."""
    if spec.mode != IN_GRAPH:
        raise ValueError("only an in-graph cluster has a coordinator")
    return {"chief": [chief], **{k: list(v) for k, v in cluster.items() if k != "chief"}}
