"""``%%tfcluster render`` prints or writes valid Kubernetes YAML and touches no cluster."""

import kubernetes_validate
import pytest
import yaml

from tests import jobset_schema as crd


@pytest.fixture
def ip(monkeypatch, tmp_path):
    from IPython import get_ipython
    from IPython.testing.globalipapp import start_ipython

    # No kubeconfig and no API server: render must not need one.
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.setenv("TFK8S_NAMESPACE", "alice")
    shell = start_ipython() or get_ipython()
    shell.run_line_magic("load_ext", "tfk8s_magics")
    return shell


def test_render_prints_valid_yaml_for_the_cell(ip, capsys):
    ip.run_cell_magic("tfcluster", "render mnist --workers 2 --ps 1 --cpu 1 --memory 2Gi --tensorboard",
                      "print('train')\n")
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    kinds = sorted(d["kind"] for d in docs)
    assert kinds.count("JobSet") == 1 and "Pod" not in kinds  # JobSet makes the pods
    assert {"ConfigMap", "Service", "PersistentVolumeClaim", "Deployment"} <= set(kinds)
    js = next(d for d in docs if d["kind"] == "JobSet")
    assert js["metadata"]["namespace"] == "alice"
    templates = [r["template"]["spec"]["template"]["spec"] for r in js["spec"]["replicatedJobs"]]
    assert [r["name"] for r in js["spec"]["replicatedJobs"]] == ["ps", "worker"]
    assert all(t["containers"][0]["resources"]["requests"]["cpu"] == "1" for t in templates)
    for d in docs:
        if d["kind"] == "JobSet":
            assert crd.problems(d) == []
            continue
        for version in ("1.29", "1.37"):
            kubernetes_validate.validate(d, version, strict=True)


def test_render_writes_one_file_per_object(ip, tmp_path, capsys):
    out = tmp_path / "yaml"
    ip.run_cell_magic("tfcluster", f"render mnist --workers 1 --output-dir {out}", "print('x')\n")
    files = sorted(out.glob("*.yaml"))
    assert files and f"wrote {len(files)} objects" in capsys.readouterr().out
    assert {yaml.safe_load(f.read_text())["kind"] for f in files} == {
        "JobSet", "ConfigMap", "PersistentVolumeClaim"}


def test_the_api_renders_what_the_magic_renders(ip, capsys):
    import tfk8s_magics as tk

    spec = tk.make_spec("mnist", workers=1, script="print('x')\n")
    docs = list(yaml.safe_load_all(tk.render(spec, tensorboard=True)))
    assert [d["kind"] for d in docs] == [o["kind"] for o in tk.render_objects(spec, tensorboard=True)]
    assert "Deployment" in {d["kind"] for d in docs}
    with pytest.raises(tk.SpecError, match="the local backend has nothing to render"):
        tk.render_objects(spec, "local")


def test_render_carries_per_role_resources_queue_and_placement(ip, capsys):
    ip.run_cell_magic(
        "tfcluster",
        "render q1 --workers 2 --ps 1 --gpus worker=1 --cpu worker=2,ps=1 --queue team-a "
        "--priority high --scheduler volcano --active-deadline 3600 --spread worker "
        "--node-affinity ps:!nvidia.com/gpu.present",
        "print('train')\n")
    js = next(d for d in yaml.safe_load_all(capsys.readouterr().out) if d["kind"] == "JobSet")
    assert js["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    pods = {r["name"]: r["template"]["spec"]["template"]["spec"]
            for r in js["spec"]["replicatedJobs"]}
    assert pods["worker"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert "nvidia.com/gpu" not in pods["ps"]["containers"][0].get("resources", {}).get(
        "limits", {})  # parameter servers take no GPU
    assert pods["ps"]["containers"][0]["resources"]["requests"]["cpu"] == "1"
    assert pods["worker"]["tolerations"][-1]["key"] == "nvidia.com/gpu"
    assert pods["ps"]["affinity"]["nodeAffinity"]
    assert pods["worker"]["affinity"]["podAntiAffinity"]
    assert {p["schedulerName"] for p in pods.values()} == {"volcano"}
    assert {p["priorityClassName"] for p in pods.values()} == {"high"}
    assert crd.problems(js) == []


@pytest.mark.parametrize("args, words", [
    ("--gpus workers=1", "ROLE=VALUE with a role among"),
    ("--queue 'Team A'", "--queue 'Team A' is not a valid name"),
    ("--node-affinity ps", "is not ROLE:REQUIREMENT"),
])
def test_bad_scheduling_flags_are_one_sentence(ip, args, words):
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match=None) as info:
        ip.run_cell_magic("tfcluster", f"render q2 {args}", "print('x')\n")
    assert words in str(info.value)


def test_the_docs_route_for_packages_on_kubernetes_runs_every_task_on_the_users_image(ip, capsys):
    """Issue 27 item 9: docs/users/packages.md's Kubernetes route — an image built FROM the task
    image with the packages, named with --image — is what every task's pod runs."""
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parent.parent / "docs" / "users" / "packages.md").read_text()
    assert re.search(r"^FROM TASK_IMAGE\nRUN python -m pip install", page, re.M), page
    line = re.search(r"^%%tfcluster launch (NAME .*--image (\S+).*)$", page, re.M)
    assert line, page
    args, image = line[1].replace("NAME", "pkgs", 1), line[2]
    ip.run_cell_magic("tfcluster", f"render {args} --ps 1", "import my_package\n")
    js = next(d for d in yaml.safe_load_all(capsys.readouterr().out) if d["kind"] == "JobSet")
    images = {r["name"]: [c["image"] for c in r["template"]["spec"]["template"]["spec"]["containers"]]
              for r in js["spec"]["replicatedJobs"]}
    assert images == {"ps": [image], "worker": [image]}, images
