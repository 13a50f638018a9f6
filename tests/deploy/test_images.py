"""The images' Dockerfile (deploy/Dockerfile) and build script (deploy/build.sh), read as files: every image
starts from Debian bookworm-slim (which deploy/base-images.sh can stand in for), the pins of the GPU image go
together, torch's source is a build argument, the CA bundle is a build secret on every step that downloads and
never lands in a layer, and named volumes mount where the image's user owns the path. `make test-deploy`
(tests/deploy/test_compose_cluster.py) builds and runs them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def stages(text: str) -> dict[str, tuple[str, str]]:
    """The Dockerfile's stages: name -> (what it is built FROM, its text)."""
    out = {}
    for stage in text.split("\nFROM ")[1:]:
        first = stage.splitlines()[0].split()
        out[first[-1]] = (first[0], stage)
    return out


def test_dockerfile_builds_every_image_from_debian_with_pcl_non_root():
    text = (REPO / "deploy" / "Dockerfile").read_text()
    found = stages(text)
    assert list(found) == ["debian", "redis", "prometheus", "python", "cpu", "gpu"]
    assert text.splitlines()[0].startswith("#") and "# syntax=" not in text  # no frontend image to pull
    assert "ARG BASE=debian:bookworm-slim" in text and found["debian"][0] == "${BASE}"
    assert {found[n][0] for n in ("redis", "prometheus", "python")} == {"debian"}
    assert found["cpu"][0] == found["gpu"][0] == "python"
    for name in ("cpu", "gpu"):
        stage = found[name][1]
        assert 'ENTRYPOINT ["pcl"]' in stage and "USER pcl" in stage, name
    assert "apt-get $ca install -y --no-install-recommends redis-server" in found["redis"][1]
    assert "install -y --no-install-recommends prometheus" in found["prometheus"][1]
    assert "python3 python3-venv" in found["python"][1]
    # torch's source is a build argument: a wheel directory in the context, or the CPU index
    cpu = found["cpu"][1]
    assert "ARG TORCH_SOURCE=index" in cpu and "ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu" in cpu
    assert "--mount=type=bind,source=deploy/wheels,target=/wheels" in cpu  # the wheels only: a stable cache key
    assert 'wheels) pip install --find-links /wheels "torch==2.13.0+cpu"' in cpu
    assert (REPO / "deploy" / "wheels" / ".gitkeep").exists()
    assert 'pip install --index-url "$TORCH_INDEX" torch==2.13.0' in cpu
    # the pins of the GPU image go together (vLLM 0.32.0 requires torch==2.13.0)
    for pin in ("vllm==0.32.0", "torch==2.13.0", "ray[default]==2.60.0"):
        assert found["gpu"][1].count(pin) == 2, pin
    assert 'ray[default]==2.60.0' in cpu
    for path in ("pcl", "actors", "services", "configs", "pyproject.toml"):
        assert (REPO / path).exists()
    ignored = (REPO / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored and "runs" in ignored


def test_the_ca_bundle_is_a_build_secret_on_every_download_and_never_copied():
    text = (REPO / "deploy" / "Dockerfile").read_text()
    runs = [step for step in text.split("\nRUN ")[1:]]
    downloads = [step for step in runs if "apt-get" in step or "pip install" in step]
    assert len(downloads) == 8
    for step in downloads:
        assert step.startswith("--mount=type=secret,id=ca_bundle"), step[:80]
        assert "/run/secrets/ca_bundle" in step
    assert "ca_bundle" not in "".join(line for line in text.splitlines() if line.startswith(("COPY", "ADD", "ENV")))
    build = (REPO / "deploy" / "build.sh").read_text()
    assert '--secret "id=ca_bundle,src=$PCL_CA_BUNDLE"' in build
    assert "build-arg" not in build.split("PCL_CA_BUNDLE", 1)[1].split("\n")[0]


def test_named_volumes_mount_where_the_image_user_owns_the_path(compose):
    """An empty named volume takes its mount point's owner: the image's user must own each one."""
    found = stages((REPO / "deploy" / "Dockerfile").read_text())

    def owned(stage: str, user: str) -> set[str]:
        parent, body = found[stage]
        mine = {word for line in body.splitlines() if f"chown {user}:{user}" in line
                for word in line.split(f"chown {user}:{user}", 1)[1].split() if word.startswith("/")}
        return mine | (owned(parent, user) if parent in found else set())

    users = {"pcl:cpu": ("cpu", "pcl"), "pcl:gpu": ("gpu", "pcl"), "pcl-redis:bookworm": ("redis", "redis"),
             "pcl-prometheus:bookworm": ("prometheus", "prometheus")}
    for name, service in compose["services"].items():
        if service["image"] not in users:
            continue
        for volume in service.get("volumes", []):
            source, target = volume.split(":")[:2]
            if not source.startswith("./") and not volume.endswith(":ro"):
                assert target in owned(*users[service["image"]]), (name, target)
