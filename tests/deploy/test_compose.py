"""docker-compose.yml: the three services, GPU reservation, CPU profile, and
only the gateway's port published. (No Docker engine runs on CI; `docker-compose
config` is checked too when Debian's docker-compose is installed.)"""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from launcher.processes import REPO_ROOT

COMPOSE = REPO_ROOT / "docker-compose.yml"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_three_services_and_cpu_profile(compose):
    services = compose["services"]
    assert {"controlplane", "dataplane", "dataplane-cpu", "gateway"} == set(services)
    assert services["dataplane"]["profiles"] == ["gpu"]
    assert services["dataplane-cpu"]["profiles"] == ["cpu"]


def test_gpu_reservation_only_on_gpu_dataplane(compose):
    services = compose["services"]
    devices = services["dataplane"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
    assert "deploy" not in services["dataplane-cpu"]


def test_every_service_restarts_on_its_own(compose):
    assert {name: svc.get("restart") for name, svc in compose["services"].items()} == {
        name: "unless-stopped" for name in compose["services"]
    }


def test_only_gateway_publishes_ports(compose):
    published = {name for name, svc in compose["services"].items() if svc.get("ports")}
    assert published == {"gateway"}


def test_dockerfile_exists_and_default_profile(compose):
    assert (REPO_ROOT / compose["services"]["controlplane"]["build"]["dockerfile"]).exists()
    assert "COMPOSE_PROFILES=gpu" in (REPO_ROOT / ".env").read_text()


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose not installed")
def test_docker_compose_config_validates():
    result = subprocess.run(
        ["docker-compose", "config", "--quiet"], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_dataplane_keeps_triton_kernels_and_waits_for_its_warm_up(compose):
    for name in ("dataplane", "dataplane-cpu"):
        svc = compose["services"][name]
        cache = svc["environment"]["TRITON_CACHE_DIR"]
        assert any(v.split(":")[1] == cache and v.split(":")[0] in compose["volumes"] for v in svc["volumes"])
        assert svc["healthcheck"]["start_period"].endswith("s")
