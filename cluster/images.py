"""Container images for the real node, made without a registry or a container engine.

No registry is reachable from these machines and no Docker engine runs, so the images are
assembled here as OCI image layouts and imported into the node's containerd:

- ``inferentia-base``: Debian bookworm's minimal system with python3 (3.11), made by
  mmdebstrap from Debian's packages and cached;
- ``inferentia-operator:<version>``: the operator's image, from the Dockerfile's own instructions:
  ``dockerfile()`` reads every instruction of its final stage, refuses one it does not know,
  installs exactly the requirement (with its extras) that the final stage's ``pip install``
  names, from this checkout's wheel and PyPI, and takes ENTRYPOINT, CMD, USER and ENV as they
  are; the base is the Debian one above instead of python:3.11-slim, which no registry here
  serves;
- ``neuron-torch-standin:0.1.0``: Debian's CPU-only PyTorch (python3-torch) with stand-ins of
  torch-neuronx, torch-neuron, vLLM, NxD Inference and the Hub client (cluster/node/standins),
  for the images AWS publishes with the real ones (pytorch-inference-neuronx,
  pytorch-inference-neuron, pytorch-inference-vllm-neuronx): the operator's compile programs
  and model server run in it. The same archive holds, for each image of AWS's that
  inferentia_operator.core.neuron_images catalogues, ``neuron-torch-standin:<short>-<tag>``
  (``standin_image()``): the same layers and one more, the ``.dist-info`` metadata of the
  Python distributions AWS lists for that tag, so that a stand-in reading
  ``importlib.metadata.version("vllm")`` behaves as that tag's package would;
- ``neuron-standin:0.1.0``: the operator's image plus the Neuron stand-ins
  (cluster/node/standins): the compilers, the runtime/server, vLLM's entry point and NxD
  Inference;
- ``inferentia-pause:1``: the pod sandbox's process (cluster/node/pause).

    python cluster/images.py            # build what is missing, print the image archives
    python cluster/images.py --parts    # only the parts that need no Go program (make controlplane, beside the Go build)
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from inferentia_operator.core import neuron_images
from inferentia_operator.core.names import DEFAULT_OPERATOR_IMAGE

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
STANDINS = HERE / "node" / "standins"
SITE = "usr/local/lib/python3.11/dist-packages"
# The operator's image under the name the operator's default --operator-image gives it.
OPERATOR_IMAGE = DEFAULT_OPERATOR_IMAGE
STANDIN_IMAGE = "neuron-standin:0.1.0"
PAUSE_IMAGE = "inferentia-pause:1"
BASE_PACKAGES = "python3,ca-certificates"
# Debian bookworm's PyTorch 1.13.1 is built for the CPU only (PyPI's Linux wheel pulls several
# GB of CUDA); 1.13 is also the PyTorch that torch-neuron (inf1) last supported.
TORCH_PACKAGES = "python3,ca-certificates,python3-torch"
TORCH_STANDIN_IMAGE = "neuron-torch-standin:0.1.0"
# What a tag may hold ("A tag name must be valid ASCII and may contain lowercase and uppercase
# letters, digits, underscores, periods and hyphens ... may not start with a period or a hyphen
# and may contain a maximum of 128 characters", https://docs.docker.com/reference/cli/docker/image/tag/).
TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


def cache_dir() -> Path:
    base = os.environ.get("INFERENTIA_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"), "inferentia-operator"
    )
    path = Path(base) / "images"
    path.mkdir(parents=True, exist_ok=True)
    return path


def log(message: str) -> None:
    print(f"[images] {message}", file=sys.stderr, flush=True)


def digest_of_files(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for path in sorted(paths):
        h.update(str(path.relative_to(REPO)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def base_rootfs(packages: str = BASE_PACKAGES) -> Path:
    """Debian bookworm, minbase, with ``packages``: one tar, cached."""
    out = cache_dir() / f"base-bookworm-{hashlib.sha256(packages.encode()).hexdigest()[:8]}.tar"
    if out.exists():
        return out
    log(f"debian base: mmdebstrap bookworm with {packages} (once)")
    tmp = out.with_suffix(".partial.tar")
    excludes = [f"--dpkgopt=path-exclude=/usr/share/{d}/*" for d in ("doc", "man", "locale", "info")]
    subprocess.run(
        ["mmdebstrap", "--variant=minbase", f"--include={packages}", *excludes, "bookworm", str(tmp)],
        check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    tmp.rename(out)
    return out


def tar_dir(root: Path) -> bytes:
    """A layer of everything under ``root``, owned by root, with stable times."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(root.rglob("*")):
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(root)))
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = 0
            if info.isfile():
                with path.open("rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return buf.getvalue()


def python_layer() -> tuple[bytes, str]:
    """This checkout's wheel, installed as the Dockerfile's final stage installs it (the same
    requirement and extras) with its dependencies, where Debian's python3 looks."""
    _, requirement = dockerfile()
    extras = requirement[requirement.index("[") :] if "[" in requirement else ""
    sources = [REPO / "pyproject.toml", REPO / "Dockerfile", *(REPO / "operator").rglob("*.py")]
    key = digest_of_files(sources)
    out = cache_dir() / f"layer-python-{key}.tar"
    if out.exists():
        return out.read_bytes(), key
    log("operator layer: pip wheel + install (this checkout)")
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(t / "wheels"), str(REPO)], check=True)
        [wheel] = (t / "wheels").glob("*.whl")
        root = t / "root"
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-compile", "--target", str(root / SITE), f"{wheel}{extras}"],
            check=True,
        )
        # pip --target leaves console scripts pointing at this interpreter: write the image's own.
        subprocess.run(["rm", "-rf", str(root / SITE / "bin")], check=True)
        bindir = root / "usr/local/bin"
        bindir.mkdir(parents=True)
        script = bindir / "inferentia-operator"
        script.write_text("#!/usr/bin/python3\nimport sys\nfrom inferentia_operator.cli import main\nsys.exit(main())\n")
        script.chmod(0o755)
        data = tar_dir(root)
    out.write_bytes(data)
    return data, key


def standin_layer() -> tuple[bytes, str]:
    files = sorted(p for p in STANDINS.rglob("*.py"))
    key = digest_of_files(files)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for f in files:
            dest = root / SITE / f.relative_to(STANDINS)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(f.read_bytes())
        bindir = root / "usr/local/bin"
        bindir.mkdir(parents=True)
        for name in ("neuron-cc", "neuronx-cc", "neuron-serve"):
            script = bindir / name
            script.write_text("#!/usr/bin/python3\nimport sys\nfrom neuron_standin import main\nsys.exit(main())\n")
            script.chmod(0o755)
        return tar_dir(root), key


def write_distributions(site: Path, distributions: dict[str, str]) -> None:
    """One ``<name>-<version>.dist-info/METADATA`` under ``site`` per distribution, as an
    installed wheel leaves it, so that ``importlib.metadata.version(name)`` finds ``version``."""
    for name, version in distributions.items():
        # The wheel's escaping of the name (PEP 427, PEP 503): importlib.metadata takes the text
        # before the first "-" of a .dist-info folder as the name, so a dash must not stay in it.
        escaped = re.sub(r"[-_.]+", "_", name).lower()
        info = site / f"{escaped}-{version}.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def distributions_layer(distributions: dict[str, str]) -> bytes:
    """A layer of only the metadata of ``distributions``, where Debian's python3 looks."""
    with tempfile.TemporaryDirectory() as tmp:
        write_distributions(Path(tmp) / SITE, distributions)
        return tar_dir(Path(tmp))


def standin_image(image: str) -> str:
    """The local stand-in of AWS's ``image``: ``<base>:<short>-<tag>``, where ``<short>`` is its
    repository's name without ``pytorch-inference-``. AWS's vLLM images stand on the light
    ``neuron-standin`` (vLLM, NxD Inference and the compilers' stand-ins need no torch), which
    every real node holds, the second one too; the framework images on ``neuron-torch-standin``."""
    versions = neuron_images.lookup(image)
    if versions is None:
        raise ValueError(f"{image} is not in inferentia_operator.core.neuron_images.CATALOGUE: no stand-in image carries its versions")
    tag = f"{versions.repository.removeprefix('pytorch-inference-')}-{versions.tag}"
    assert TAG.fullmatch(tag), f"{tag!r} (for {image}) is no valid image tag"
    base = STANDIN_IMAGE if versions.repository == neuron_images.VLLM_REPOSITORY else TORCH_STANDIN_IMAGE
    return f"{base.rpartition(':')[0]}:{tag}"


def catalogue_variants(base: str) -> dict[str, dict[str, str]]:
    """Each catalogued AWS image that stands on ``base``: its stand-in name, and the distributions it carries."""
    names = {image: standin_image(image) for image in neuron_images.CATALOGUE}
    return {
        names[image]: versions.distributions
        for image, versions in neuron_images.CATALOGUE.items()
        if names[image].startswith(base.rpartition(":")[0] + ":")
    }


# The instructions the Dockerfile's final stage may use, and what each becomes here. Any
# other instruction fails the build, so the Dockerfile cannot grow a step this recipe skips.
KNOWN_INSTRUCTIONS = {"FROM", "RUN", "ENV", "USER", "ENTRYPOINT", "CMD"}


def dockerfile(path: Path = REPO / "Dockerfile") -> tuple[dict, str]:
    """The final stage's image configuration (ENTRYPOINT, CMD, USER, ENV) and the requirement
    its ``pip install`` names (``inferentia-operator[s3]``)."""
    stages = path.read_text().replace("\\\n", " ").split("\nFROM ")
    config: dict = {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]}
    requirement = None
    for line in ("FROM " + stages[-1]).splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        if word not in KNOWN_INSTRUCTIONS:
            raise ValueError(f"Dockerfile: the final stage's {word} has no counterpart in cluster/images.py")
        if word == "ENTRYPOINT":
            config["Entrypoint"] = json.loads(rest)
        elif word == "CMD":
            config["Cmd"] = json.loads(rest)
        elif word == "USER":
            config["User"] = rest.strip()
        elif word == "ENV":
            config["Env"] += shlex.split(rest)
        elif word == "RUN":
            words = shlex.split(rest)
            if "install" in words and "pip" in words:
                requirement = next(w for w in words[words.index("install") + 1 :] if not w.startswith("-") and "/" not in w)
    if not requirement or not requirement.startswith("inferentia-operator"):
        raise ValueError("Dockerfile: the final stage installs no inferentia-operator requirement")
    return config, requirement


def dockerfile_config(path: Path = REPO / "Dockerfile") -> dict:
    """ENTRYPOINT, CMD, USER and ENV of the Dockerfile's final stage, as an image config."""
    return dockerfile(path)[0]


def write_oci(out: Path, name: str, layers: list[bytes], config: dict) -> None:
    """An OCI image layout in a tar, which ``ctr images import`` reads, named ``name``."""
    write_oci_images(out, [(name, layers, config)])


def write_oci_images(out: Path, images: list[tuple[str, list[bytes], dict]]) -> None:
    """One OCI image layout in a tar holding every image of ``images`` (name, layers, config):
    one manifest per name in its index, each blob once. ``ctr images import`` imports every
    manifest of the index that carries a name."""
    blobs: dict[str, bytes] = {}
    # Images share layers as the same bytes objects: hash each object once, not once per image
    # (the torch base is several hundred MB). Each entry holds its object, so no id is reused.
    by_object: dict[int, tuple[bytes, dict]] = {}

    def blob(data: bytes, media_type: str) -> dict:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"mediaType": media_type, "digest": digest, "size": len(data)}

    def layer(data: bytes) -> dict:
        if id(data) not in by_object:
            by_object[id(data)] = data, blob(data, "application/vnd.oci.image.layer.v1.tar")
        return by_object[id(data)][1]

    manifests = []
    for name, layers, config in images:
        layer_descs = [layer(data) for data in layers]
        image_config = {
            "architecture": "amd64",
            "os": "linux",
            "config": config,
            "rootfs": {"type": "layers", "diff_ids": [d["digest"] for d in layer_descs]},
        }
        config_desc = blob(json.dumps(image_config).encode(), "application/vnd.oci.image.config.v1+json")
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": config_desc,
            "layers": layer_descs,
        }
        manifest_desc = blob(json.dumps(manifest).encode(), "application/vnd.oci.image.manifest.v1+json")
        full = name if "/" in name.split(":")[0] else f"docker.io/library/{name}"
        manifest_desc["annotations"] = {"io.containerd.image.name": full, "org.opencontainers.image.ref.name": name.split(":")[-1]}
        manifests.append(manifest_desc)
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": manifests}
    tmp = out.with_suffix(".partial")
    with tarfile.open(tmp, "w") as tar:

        def add(arcname: str, data: bytes) -> None:
            info = tarfile.TarInfo(arcname)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

        add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add("index.json", json.dumps(index).encode())
        for digest, data in blobs.items():
            add(f"blobs/sha256/{digest.removeprefix('sha256:')}", data)
    tmp.rename(out)


def build(bins: Path) -> list[Path]:
    """Every image the real node needs, as OCI archives (cached by content)."""
    base_tar = base_rootfs()
    base = base_tar.read_bytes()
    python, pkey = python_layer()
    standins, skey = standin_layer()
    bkey = base_tar.stem.rsplit("-", 1)[-1]
    config = dockerfile_config()
    images = []
    operator = cache_dir() / f"operator-{bkey}-{pkey}.oci.tar"
    if not operator.exists():
        log(f"{OPERATOR_IMAGE}: assembling")
        write_oci(operator, OPERATOR_IMAGE, [base, python], config)
    images.append(operator)
    light = catalogue_variants(STANDIN_IMAGE)
    lkey = hashlib.sha256(json.dumps(light, sort_keys=True).encode()).hexdigest()[:8]
    standin = cache_dir() / f"standin-{bkey}-{pkey}-{skey}-{lkey}.oci.tar"
    if not standin.exists():
        log(f"{STANDIN_IMAGE} and {len(light)} variants, one per catalogued AWS vLLM image: assembling")
        # The stand-ins run as whatever user the pod says; no entry point of their own.
        layers, standin_config = [base, python, standins], {"Env": config["Env"]}
        write_oci_images(
            standin,
            [(STANDIN_IMAGE, layers, standin_config)]
            + [(name, [*layers, distributions_layer(distributions)], standin_config) for name, distributions in light.items()],
        )
    images.append(standin)
    torch_base = base_rootfs(TORCH_PACKAGES)
    tkey = torch_base.stem.rsplit("-", 1)[-1]
    variants = catalogue_variants(TORCH_STANDIN_IMAGE)
    vkey = hashlib.sha256(json.dumps(variants, sort_keys=True).encode()).hexdigest()[:8]
    torch_standin = cache_dir() / f"torch-standin-{tkey}-{skey}-{vkey}.oci.tar"
    if not torch_standin.exists():
        log(f"{TORCH_STANDIN_IMAGE} and {len(variants)} variants, one per catalogued AWS image: assembling")
        # Like AWS's framework images: python3 with torch and the Neuron framework, and an entry
        # point the operator never relies on (it gives every container its command).
        torch_config = {"Env": config["Env"], "Cmd": ["python3"]}
        torch_layers = [torch_base.read_bytes(), standins]
        write_oci_images(
            torch_standin,
            [(TORCH_STANDIN_IMAGE, torch_layers, torch_config)]
            + [(name, [*torch_layers, distributions_layer(distributions)], torch_config) for name, distributions in variants.items()],
        )
    images.append(torch_standin)
    pause = pause_image(bins, PAUSE_IMAGE, cache_dir())
    images.append(pause)
    prune(keep=[*images, cache_dir() / f"layer-python-{pkey}.tar"])
    return images


def pause_image(bins: Path, name: str, directory: Path) -> Path:
    """The pod sandbox's process (cluster/node/pause) as image ``name``, cached in ``directory``."""
    pause_bin = bins / "pause"
    out = directory / f"pause-{hashlib.sha256(pause_bin.read_bytes()).hexdigest()[:12]}.oci.tar"
    if not out.exists():
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "pause").write_bytes(pause_bin.read_bytes())
            (Path(tmp) / "pause").chmod(0o755)
            write_oci(out, name, [tar_dir(Path(tmp))], {"Entrypoint": ["/pause"], "User": "65535:65535"})
    return out


# Kinds of cached archive that each change of the operator or the stand-ins makes anew (about
# 1 GB a set): without pruning, a day of development filled this machine's disk, and the kubelet
# then tainted the real node with disk-pressure. The newest few of each kind are kept, so that
# two checkouts (a worktree beside the main one) do not rebuild each other's. No kind's prefix
# is the start of another's.
PRUNED_KINDS = ("operator-", "standin-", "compile-standin-", "torch-standin-", "layer-python-", "pause-")
KEEP_PER_KIND = 3


def prune(keep: list[Path]) -> list[Path]:
    """Deletes all but the newest KEEP_PER_KIND archives of each kind (never one in ``keep``);
    returns what it deleted."""
    removed = []
    for kind in PRUNED_KINDS:
        files = sorted(
            (f for f in cache_dir().glob(f"{kind}*.tar") if f.name.startswith(kind)), key=lambda f: f.stat().st_mtime, reverse=True
        )
        for f in files[KEEP_PER_KIND:]:
            if f not in keep:
                f.unlink(missing_ok=True)
                removed.append(f)
    if removed:
        log(f"pruned {len(removed)} stale archives from {cache_dir()}")
    return removed


def parts() -> list[Path]:
    """The cached parts that take long and need no Go program: the two Debian bases (about
    110 s from an empty cache, mostly fetching and unpacking Debian's packages) and the
    operator's layer, so that `make controlplane` makes them while the Go programs compile."""
    _, pkey = python_layer()
    return [base_rootfs(), base_rootfs(TORCH_PACKAGES), cache_dir() / f"layer-python-{pkey}.tar"]


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    if sys.argv[1:] == ["--parts"]:
        import realnode

        reason = realnode.unavailable_reason()
        for path in parts() if reason is None else []:
            print(path)
        if reason is not None:
            log(f"no images made: the real node will not run here ({reason})")
        sys.exit(0)
    from localcluster import bin_dir

    for path in build(bin_dir()):
        print(path)
