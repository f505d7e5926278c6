"""The wheel the image installs, the Dockerfile's promises, and the chart's copy of the CRDs."""

import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_chart_carries_the_same_crds():
    for crd in (ROOT / "crds").glob("*.yaml"):
        copy = ROOT / "charts" / "inferentia-operator" / "crds" / crd.name
        assert copy.read_text() == crd.read_text(), f"run `make crd`: {copy} differs from {crd}"


def test_the_wheel_holds_every_module_and_the_console_script(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
    )
    [wheel] = tmp_path.glob("inferentia_operator-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    modules = {p.name for p in (ROOT / "operator" / "inferentia_operator").glob("*.py")}
    assert modules <= {Path(n).name for n in names if n.startswith("inferentia_operator/")}
    assert not any(n.startswith("operator/") for n in names), "never ship an importable `operator` package"
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "inferentia-operator = inferentia_operator.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_the_dockerfile_runs_a_slim_image_as_non_root_without_build_tools():
    text = (ROOT / "Dockerfile").read_text()
    stages = re.split(r"^FROM ", text, flags=re.M)[1:]
    final = stages[-1]
    assert final.startswith("python:3.11-slim")
    user = re.search(r"^USER (\d+):(\d+)$", final, re.M)
    assert user and int(user.group(1)) != 0 and int(user.group(2)) != 0
    assert "--no-index" in final, "the final stage installs only the wheels built in the first"
    assert not re.search(r"apt-get|gcc|build-essential", final)
    assert "pip uninstall --yes pip setuptools wheel" in final


def test_the_local_image_follows_the_dockerfiles_instructions(tmp_path):
    """cluster/images.py builds the operator's image from the Dockerfile's final stage: the
    requirement it installs (with the s3 extra the artefact fetch and upload need), and its
    configuration; an instruction it has no counterpart for fails the build."""
    sys.path.insert(0, str(ROOT / "cluster"))
    try:
        import images
    finally:
        sys.path.remove(str(ROOT / "cluster"))
    config, requirement = images.dockerfile()
    assert requirement == "inferentia-operator[s3]"
    assert (config["Entrypoint"], config["Cmd"], config["User"]) == (["inferentia-operator"], ["run"], "65532:65532")
    assert "PYTHONDONTWRITEBYTECODE=1" in config["Env"]
    grown = tmp_path / "Dockerfile"
    grown.write_text((ROOT / "Dockerfile").read_text().replace("USER 65532:65532", "ADD https://example.com/x /x\nUSER 65532:65532"))
    try:
        images.dockerfile(grown)
    except ValueError as exc:
        assert "ADD has no counterpart" in str(exc)
    else:
        raise AssertionError("an unknown instruction in the final stage was ignored")
    without_extra = tmp_path / "Dockerfile.plain"
    without_extra.write_text((ROOT / "Dockerfile").read_text().replace("'inferentia-operator[s3]'", "inferentia-operator"))
    assert images.dockerfile(without_extra)[1] == "inferentia-operator"  # what the image installs follows the Dockerfile


def test_one_version_everywhere():
    """The package, pyproject, the chart and the operator's default image name one version,
    so the upgrade notes (docs/install.md) can say which release they apply to."""
    import tomllib

    import yaml

    from inferentia_operator import __version__
    from inferentia_operator.core.names import DEFAULT_OPERATOR_IMAGE

    chart = yaml.safe_load((ROOT / "charts" / "inferentia-operator" / "Chart.yaml").read_text())
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"] == __version__
    assert chart["version"] == chart["appVersion"] == __version__
    assert DEFAULT_OPERATOR_IMAGE == f"inferentia-operator:{__version__}"
    assert f"to {__version__}" in (ROOT / "docs" / "install.md").read_text()  # the upgrade notes name it


def test_the_image_cache_keeps_the_newest_few_of_each_kind_and_those_in_use(tmp_path, monkeypatch):
    """Every change of the operator makes a new set of image archives (about 1 GB): stale ones go."""
    import os

    monkeypatch.setenv("INFERENTIA_CACHE_DIR", str(tmp_path))
    sys.path.insert(0, str(ROOT / "cluster"))
    try:
        import images
    finally:
        sys.path.remove(str(ROOT / "cluster"))
    cache = images.cache_dir()
    names = [f"{kind}{i}.oci.tar" for kind in ("operator-", "standin-", "compile-standin-") for i in range(6)]
    for age, name in enumerate(names):
        (cache / name).write_bytes(b"")
        os.utime(cache / name, (1000 + age, 1000 + age))
    in_use = cache / "operator-0.oci.tar"  # the oldest, but the one this build uses
    removed = images.prune(keep=[in_use])
    left = sorted(p.name for p in cache.iterdir())
    assert left == sorted(
        ["operator-0.oci.tar", *(f"{kind}{i}.oci.tar" for kind in ("operator-", "standin-", "compile-standin-") for i in (3, 4, 5))]
    )
    assert len(removed) == len(names) - len(left)
