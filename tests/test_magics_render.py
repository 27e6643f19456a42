"""``%%tfcluster render`` prints or writes valid Kubernetes YAML and touches no cluster."""

import kubernetes_validate
import pytest
import yaml


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
    assert kinds.count("Pod") == 3
    assert {"ConfigMap", "Service", "PersistentVolumeClaim", "Deployment"} <= set(kinds)
    pods = [d for d in docs if d["kind"] == "Pod"]
    assert {p["metadata"]["namespace"] for p in pods} == {"alice"}
    assert all(p["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "1" for p in pods)
    for d in docs:
        for version in ("1.29", "1.37"):
            kubernetes_validate.validate(d, version, strict=True)


def test_render_writes_one_file_per_object(ip, tmp_path, capsys):
    out = tmp_path / "yaml"
    ip.run_cell_magic("tfcluster", f"render mnist --workers 1 --output-dir {out}", "print('x')\n")
    files = sorted(out.glob("*.yaml"))
    assert files and f"wrote {len(files)} objects" in capsys.readouterr().out
    assert {yaml.safe_load(f.read_text())["kind"] for f in files} >= {"Pod", "ConfigMap", "Service"}


def test_the_api_renders_what_the_magic_renders(ip, capsys):
    import tfk8s_magics as tk

    spec = tk.make_spec("mnist", workers=1, script="print('x')\n")
    docs = list(yaml.safe_load_all(tk.render(spec, tensorboard=True)))
    assert [d["kind"] for d in docs] == [o["kind"] for o in tk.render_objects(spec, tensorboard=True)]
    assert "Deployment" in {d["kind"] for d in docs}
    with pytest.raises(tk.SpecError, match="the local backend has nothing to render"):
        tk.render_objects(spec, "local")
