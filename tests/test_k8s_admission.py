"""What the lab makes of admission, as pure functions (fast, no cluster).

The LimitRange pre-flight's sentences, the sentences a user gets for an admission refusal (the
messages are the real kube-apiserver 1.36's words, as tests/test_kube_admission.py asserts them
against the running API server), and the recommended labels on every object. The behaviour —
LimitRanger, quota, Pod Security, the size limits, the shipped Role, a launch in a bootstrapped
namespace — is tested against the real cluster in tests/test_kube_admission.py.
"""

from __future__ import annotations

import json

import pytest
from kubernetes.client.rest import ApiException

from tfk8s_magics.backends.kubernetes import jobset as j
from tfk8s_magics.backends.kubernetes.apply import failure_sentence
from tfk8s_magics.backends.kubernetes.quota import limit_problems
from tfk8s_magics.backends.kubernetes.settings import K8sSettings
from tfk8s_magics.lifecycle import LifecyclePolicy
from tfk8s_magics.spec import ClusterSpec, Resources

NS = "jhub-alice"
SCRIPT = "print('training')\n"


def test_limit_problems_name_max_min_and_ratio():
    ranges = [{"metadata": {"name": "lr"}, "spec": {"limits": [{
        "type": "Container", "max": {"memory": "2Gi"}, "min": {"cpu": "250m"}}]}}]
    spec = ClusterSpec(name="c", workers=1, script=SCRIPT,
                       resources={"worker": Resources(cpu="100m", memory="4Gi")})
    problems = limit_problems(j.cluster_manifests(spec, K8sSettings(namespace=NS)), ranges)
    assert problems == [  # named per role: one JobSet template runs every worker
        "c-worker has a memory limit of 4Gi but LimitRange lr allows at most 2Gi per "
        "container: ask for less (--memory).",
        "c-worker requests cpu 100m but LimitRange lr asks for at least 250m per container: "
        "ask for more (--cpu).",
    ]


@pytest.mark.parametrize("status, message, words", [
    (403, 'pods "p" is forbidden: exceeded quota: q, requested: pods=1, used: pods=4, '
          "limited: pods=4", "ResourceQuota"),
    (403, 'pods "p" is forbidden: failed quota: q: must specify limits.cpu',
     "give --cpu and --memory"),
    (403, 'pods "p" is forbidden: maximum cpu usage per Container is 2, but limit is 4',
     "LimitRange refuses"),
    (403, 'pods "p" is forbidden: violates PodSecurity "restricted:latest": privileged (...)',
     "Pod Security level refuses"),
    (422, 'Pod "p" is invalid: spec.containers[0].resources.requests: Invalid value: '
          '"4": must be less than or equal to cpu limit of 2', "ask for less (--cpu"),
    (422, 'ConfigMap "p" is invalid: []: Too long: may not be more than 1048576 bytes',
     "/data volume"),
])
def test_admission_refusals_become_sentences_a_user_can_act_on(status, message, words):
    e = ApiException(status=status, reason="x")
    e.body = json.dumps({"kind": "Status", "message": message, "code": status})
    sentence = failure_sentence(e, {"kind": "Pod", "metadata": {"name": "p"}}, NS)
    assert words in sentence and "bug" not in sentence
    assert message.split(": ", 1)[1][:30] in sentence  # the API's own reason is kept


def test_every_object_carries_the_recommended_labels():
    spec = ClusterSpec(name="mnist", ps=1, workers=1, script=SCRIPT)
    for obj in j.cluster_manifests(spec, K8sSettings(namespace=NS), tensorboard=True):
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "tfk8s"
        assert labels["app.kubernetes.io/instance"] == "mnist"
        assert labels["app.kubernetes.io/part-of"] == "tfk8s-lab"
        assert labels["app.kubernetes.io/managed-by"] == "tfk8s"
        assert labels["app.kubernetes.io/component"] == labels["tfk8s.io/component"]
    jobset = j.jobset(spec, K8sSettings(namespace=NS), LifecyclePolicy.of(spec))
    worker = next(r for r in jobset["spec"]["replicatedJobs"] if r["name"] == "worker")
    assert worker["template"]["spec"]["template"]["metadata"]["labels"]["tfk8s.io/role"] == "worker"
