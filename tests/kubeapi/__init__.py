'''A fake Kubernetes API server for tests — a TEST DOUBLE, not a cluster.

What it is still for
====================
Every behaviour of the lab on Kubernetes is proven on the real cluster of
``scripts/kube up`` (tests/test_kube_*.py, tests/test_k8s_defects_real.py, and
tests/test_k8s_pods.py on the tier-2 node). This double stays only where the real
cluster cannot produce the case on demand, or not in tier 1:

* pod logs written line by line at a test's command (kwok's pods write none):
  the storage steps' ``fetch`` progress (tests/test_k8s_storage.py);
* a log stream the server drops in the middle of a follow
  (``drop_log_streams``), re-opened with ``sinceTime``;
* a JobSet CRD older than v0.7 (the test cluster runs one JobSet, v0.12);
* JobSet's InOrder start held at a chosen step (``jobset_in_order``): the
  pods an unfinished JobSet is still to create, a sync step's init container
  running while no task pod exists;
* init containers: a failed or progressing ``fetch`` (the test cluster's kwok
  stages make a pod ready at once);
* a notebook that may not read PriorityClasses (the test cluster's chart
  may grant it cluster-wide);
* the podman "kubelet" (tests/containers/kubelet.py) that runs the double's
  pods as containers (tests/test_containers.py).

``tests.kubeapi`` runs a real HTTP server on 127.0.0.1 (free port, background
threads, one per test) that speaks enough of the Kubernetes REST API for the
*official* ``kubernetes`` Python client to work against it unmodified:
typed ``CoreV1Api``/``AppsV1Api``/``BatchV1Api``/``NetworkingV1Api``/
``RbacAuthorizationV1Api``/``StorageV1Api`` calls, ``kubernetes.watch.Watch()
.stream(...)`` and ``read_namespaced_pod_log(..., follow=True,
_preload_content=False)``. Nothing runs: pods move through their lifecycle
only when a test says so.

Using it
========

The ``kube`` fixture (registered from ``tests/conftest.py``) yields a started
:class:`~tests.kubeapi.harness.KubeHarness`::

    from kubernetes import client, watch

    def test_launch(kube):
        kube.create_namespace("alice")
        kube.set_role(SHIPPED_ROLE, namespace="alice", service_account="notebook")
        backend = KubernetesBackend(api_client=kube.api_client, namespace="alice")
        backend.launch(spec)                        # your code, the official client
        pod = kube.get_object("Pod", "mnist-worker-0", "alice")
        kube.kubelet.run("alice", "mnist-worker-0")  # Pending -> Running (+ events)
        kube.kubelet.log("alice", "mnist-worker-0", "step 1/100")
        kube.kubelet.succeed("alice", "mnist-worker-0")
        assert all(r.allowed and r.namespace == "alice"
                   for r in kube.requests if r.user != "system:admin")

Harness API (``kube``)
----------------------
* ``url`` — ``http://127.0.0.1:PORT``; ``api_client`` — an ``ApiClient`` that
  acts as the ServiceAccount given to ``set_role`` (allowed everything while no
  role is set); ``admin_api_client`` / ``new_api_client(admin=False)`` — more
  clients (admin ones bypass RBAC).
* ``set_role(role: dict, namespace: str, service_account="default")``,
  ``clear_role()`` — enforce one namespaced rbac/v1 Role for non-admin requests.
* ``requests`` — list of ``RecordedRequest(time, method, path, query, verb,
  group, resource, subresource, namespace, name, user, allowed, code)``, with
  ``resource_path`` (``pods/log``); ``clear_requests()``. Harness shortcuts are
  not recorded; admin clients are recorded with ``user == "system:admin"``.
* ``create_namespace(name, labels=None)``, ``create_object(obj)`` (validation
  and admission, no RBAC), ``get_object(kind, name, namespace=None)``,
  ``list_objects(kind, namespace=None, label_selector=None)``,
  ``events(namespace, involved_name=None, reason=None)``,
  ``wait_for(condition, timeout=5.0, interval=0.02, message=...)``.
  ``kind`` accepts ``Pod``, ``pods``, ``pod`` or ``deployments.apps``.
* ``kubelet`` — :class:`~tests.kubeapi.kubelet.SimulatedKubelet`:
  ``schedule(ns, name, node=None)``, ``run_init(ns, name)``,
  ``fail_init(ns, name, exit_code=1)``, ``run(ns, name, node=None)``,
  ``succeed(ns, name, exit_code=0, container=None)``,
  ``log(ns, name, text, container=None)``. Each step writes the status a
  kubelet would and emits the Events it would (Scheduled, Pulling, Pulled,
  Created, Started, Killing).
* ``make_kube(kubernetes_version="1.29", nodes=("node-1",), history_size=1000,
  strict_validation=True, jobset_in_order=False)`` —
  fixture factory for
  non-default options (``jobset_in_order``: a JobSet with ``startupPolicy: InOrder`` gets a replicated
  Job's pods only once every pod of the ones before is ready or ended).
* ``jobsets`` — :class:`~tests.kubeapi.jobsets.JobSetDriver`: ``pods(ns, name,
  attempt=None)``, ``pod_name(ns, name, role, index)``, and what a test says
  JobSet did: ``finish(ns, name, condition, reason, message)``.
* ``store`` — the raw :class:`~tests.kubeapi.store.Store`, if you must.

What it models
==============
* Kinds (table in ``resources.py``; one line adds one): namespaces, nodes,
  pods (+status, +log), services, configmaps, secrets, serviceaccounts, PVCs,
  events, resourcequotas, limitranges (stored, not enforced), apps/v1
  deployments and batch/v1 jobs (stored, no controller),
  networking/v1 networkpolicies, rbac/v1 roles and rolebindings,
  storage/v1 storageclasses, and the custom resource jobset.x-k8s.io/v1alpha2
  JobSet (validated against its CRD schema with undeclared fields refused,
  ``tests/jobset_schema.py``; discovery of its group at ``/apis`` and ``/apis/G/V``; the
  Service and pods JobSet would create, named and labelled as JobSet and the
  Job controller do — but none of JobSet's lifecycle: ``jobsets.py``).
* create/get/list/update/patch/delete/deletecollection with uid, a global
  monotonic ``resourceVersion``, ``creationTimestamp``, ``generation`` (kinds
  with a status subresource; bumped on spec change), ``generateName``,
  optimistic locking (409 Conflict), ``dryRun=All``, ``limit``/``continue``.
  Writes to the main resource keep ``.status``; ``/status`` writes change only
  ``.status``. DELETE answers with the object for pods, services, PVCs,
  service accounts and namespaces, a ``Status`` for other kinds (as real).
* Errors are real ``Status`` bodies: 404 NotFound (also a namespaced create in
  a missing namespace), 409 AlreadyExists/Conflict, 422 Invalid, 403 Forbidden,
  400 BadRequest, 410 Expired.
* Validation: ``kubernetes-validate``'s strict schemas of the configured
  version, compiled once per kind (same verdicts as
  ``kubernetes_validate.validate(obj, version, strict=True)``, ~100x faster;
  unknown field → 422 even though a real server only warns unless the client
  asks for ``fieldValidation=Strict``). Note that the v37 client's typed
  methods already refuse unknown fields client-side (pydantic, before any
  request); the server check catches dict bodies sent any other way. Names (DNS-1123 subdomain,
  DNS-1123 label for namespaces, DNS-1035 for services), label keys/values,
  pod hostname/subdomain/container names.
* Label selectors (``=``, ``==``, ``!=``, ``in``, ``notin``, ``key``, ``!key``)
  and field selectors (``=``/``!=`` on ``metadata.name``, ``metadata.namespace``
  and per-kind labels such as ``status.phase``, ``spec.nodeName``,
  ``involvedObject.name``, ``reason``, ``type``) on list, watch and
  deletecollection; an unsupported field label is 400.
* Watch: chunked JSON lines ADDED/MODIFIED/DELETED, initial ADDED events when
  no resourceVersion (or "0") is given, replay from a resourceVersion out of a
  bounded history (``history_size``) and an ERROR event with 410 Expired when
  it is too old, ``timeoutSeconds``, objects entering/leaving a selector seen
  as ADDED/DELETED.
* Garbage collection: deleting an owner deletes (recursively, synchronously)
  every object whose ownerReferences point at its uid and that has no other
  live owner; ``propagationPolicy=Orphan`` strips the reference instead;
  ``Foreground`` keeps the owner (``deletionTimestamp``, finalizer
  ``foregroundDeletion``) until its dependents are gone.
  Deleting a namespace deletes its contents. Deletion is immediate whatever
  ``gracePeriodSeconds`` says; the kubelet still emits ``Killing`` events.
* RBAC: one Role bound to one ServiceAccount (apiGroups, resources incl.
  ``pods/log``-style subresources and ``*``, verbs, resourceNames); denial is
  403 with the real wording, e.g. ``pods is forbidden: User
  "system:serviceaccount:NS:SA" cannot create resource "pods" in API group ""
  in the namespace "other"``.
* Admission, in the real server's order: pod defaults (restartPolicy,
  imagePullPolicy, qosClass, requests default to limits, ``status.phase:
  Pending``); a request above its limit → 422;
  ConfigMap/Secret data over 1 MiB → 422 ``Too long``; a request body over
  3 MiB → 413; ResourceQuota on ``pods``,
  ``cpu``, ``memory``, ``requests.*``, ``limits.*`` (incl.
  ``requests.nvidia.com/gpu``), object counts (``services``, ``configmaps``,
  ``count/<resource>``...) → 403 ``exceeded quota: ...`` or ``failed quota:
  ...: must specify ...``; ``status.used`` kept current (terminal pods free
  their share). Controllers' pods pass the same admission.
* Pod logs: ``container``, ``follow`` (streams until the container
  terminates, restarts, or the pod is deleted), ``tailLines``, ``timestamps``,
  ``previous``, ``limitBytes``; 400 ``container "c" in pod "p" is waiting to
  start: ContainerCreating`` for a container that has not started, and 400
  when a multi-container pod's log is read without ``container``.

What it does NOT model
======================
* Authentication (any non-admin request is the bound ServiceAccount), cluster
  roles, several bindings, aggregated discovery (``/api``, ``/apis``), OpenAPI
  documents, protobuf/CBOR, server-side apply (415), real strategic merge
  (strategic merge patch is treated as a JSON merge patch: lists are replaced,
  not merged by key), immutability of most pod spec fields, finalizers other
  than ``foregroundDeletion``, graceful termination, LimitRanger, Pod Security, Kueue,
  the Deployment and Job controllers, JobSet's restarts, watch bookmarks, ``/exec``/``/attach``/
  ``/portforward``, ReplicaSets/StatefulSets/CronJobs, Service endpoints or
  DNS, network policy enforcement, PVC binding (claims stay as created),
  node capacity in scheduling, quota scopes and storage quotas.
* Pod IPs are data only: nothing listens on them, never connect to them.
'''

from .api import ADMIN_TOKEN, RecordedRequest
from .harness import KubeHarness
from .kubelet import PodNotFound, SimulatedKubelet

__all__ = ["ADMIN_TOKEN", "KubeHarness", "PodNotFound", "RecordedRequest", "SimulatedKubelet"]
