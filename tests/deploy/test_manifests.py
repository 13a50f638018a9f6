"""The deployment files, validated: docker-compose.yml against the Compose specification's JSON schema, the
KubeRay manifests against the RayCluster / RayJob CRDs (tests/deploy/k8s_schema.py), and what each must do for
the service (persistence, health checks, GPU reservations, profiles, placement, the run config). No Docker
engine or cluster is needed; the negative tests show the validators reject what they should."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.deploy.k8s_schema import submission_modes, validate

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "data" / "deploy"
KUBERAY = REPO / "deploy" / "kuberay"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


@pytest.fixture(scope="module")
def compose_schema() -> dict:
    return json.loads((SHARED / "compose" / "compose-spec.json").read_text())


@pytest.fixture(scope="module")
def manifests() -> dict[tuple[str, str], dict]:
    kustomization = yaml.safe_load((KUBERAY / "kustomization.yaml").read_text())
    objects = {}
    for name in kustomization["resources"]:
        for doc in yaml.safe_load_all((KUBERAY / name).read_text()):
            objects[(doc["kind"], doc["metadata"]["name"])] = doc
    return objects


# -- docker-compose.yml -------------------------------------------------------------------------------------------

def test_compose_file_is_valid_against_the_compose_spec(compose, compose_schema):
    jsonschema.Draft7Validator(compose_schema).validate(compose)


def test_compose_validator_rejects_a_wrong_file(compose, compose_schema):
    bad = json.loads(json.dumps(compose))
    bad["services"]["ray-cpu-head"]["depends_on"]["redis"]["condition"] = "service_happy"  # not a condition
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(compose_schema).validate(bad)
    bad = json.loads(json.dumps(compose))
    bad["services"]["redis"]["restart_policy"] = "always"  # not a service key
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(compose_schema).validate(bad)


def test_redis_persists_and_reports_health(compose):
    redis = compose["services"]["redis"]
    command = " ".join(redis["command"])
    assert "--appendonly yes" in command
    assert redis["healthcheck"]["test"][-1] == "ping"
    assert any(v.endswith(":/data") for v in redis["volumes"])


def test_every_ray_node_takes_the_run_configs_ray_timeouts_from_its_environment(compose):
    """A cluster's Ray reads its health checks and head timeout from each node's environment at `ray start`: every
    Ray node of the compose file has the `ray` section's defaults there (docs/operations.md, "Timeouts on a
    cluster"), and the bounds on Ray's own growth that `pcl train` gives a local Ray (docs/operations.md, "Long
    runs": GCS task events, log rotation)."""
    from actors.runtime import RAY_LIMITS
    from pcl.config_ray import RayConfig

    nodes = {name: s for name, s in compose["services"].items() if s.get("entrypoint") == ["ray"]}
    assert len(nodes) >= 5, sorted(nodes)  # both profiles' heads and workers
    for name, service in nodes.items():
        env = {k: str(v) for k, v in service["environment"].items()}
        assert RayConfig().ray_start_env().items() <= env.items(), name
        assert RAY_LIMITS.items() <= env.items(), name  # Ray's own growth bounded as `pcl train` bounds a local Ray


def test_heads_keep_rays_state_in_a_redis_of_their_own(compose):
    """GCS fault tolerance (docs/deploy.md, "Losing the head"): both heads' GCS on gcs-redis, not on the work
    streams' Redis; the password only the heads hold; gcs-redis persisted and health-checked like Redis."""
    services = compose["services"]
    gcs = services["gcs-redis"]
    assert gcs["image"] == services["redis"]["image"] and gcs["command"] == services["redis"]["command"]
    assert gcs["environment"]["REDIS_PASSWORD"].startswith("${RAY_GCS_REDIS_PASSWORD:?")
    assert gcs["environment"]["REDIS_MAXMEMORY"] == "${RAY_GCS_REDIS_MAXMEMORY:-256mb}"
    assert gcs["volumes"] == ["gcs-redis-data:/data"] and "gcs-redis-data" in compose["volumes"]
    assert gcs["healthcheck"]["test"] == services["redis"]["healthcheck"]["test"] and "ports" not in gcs
    for name in ("ray-cpu-head", "ray-head"):
        head = services[name]
        assert head["environment"]["RAY_REDIS_ADDRESS"] == "gcs-redis:6379", name
        assert head["environment"]["RAY_external_storage_namespace"] == "${RAY_GCS_NAMESPACE:-pcl}", name
        assert head["depends_on"]["gcs-redis"] == {"condition": "service_healthy"}, name
        password = [a for a in head["command"] if a.startswith("--redis-password=")]
        assert password == ["--redis-password=" + gcs["environment"]["REDIS_PASSWORD"]], name
        assert head["restart"] == "unless-stopped", name  # a head whose GCS died comes back by itself
    for name, service in services.items():  # nothing else holds the GCS Redis' password or address
        if name not in ("ray-cpu-head", "ray-head", "gcs-redis"):
            assert "RAY_GCS_REDIS_PASSWORD" not in json.dumps(service), name
            assert "RAY_REDIS_ADDRESS" not in service.get("environment", {}), name


def test_gpu_workers_reserve_gpus_and_shared_memory(compose):
    worker = compose["services"]["ray-gpu-worker"]
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert devices and devices[0]["capabilities"] == ["gpu"] and devices[0]["driver"] == "nvidia"
    assert worker["shm_size"] and compose["services"]["ray-head"]["shm_size"]
    assert "--address=pcl-head:6379" in worker["command"]


def test_control_plane_token_is_required_not_defaulted(compose):
    token = compose["x-pcl-env"]["PCL_API_TOKEN"]
    assert token.startswith("${PCL_API_TOKEN:?"), token  # compose stops with the message when it is unset
    for name in ("ray-cpu-head", "ray-cpu-worker-rollout", "ray-cpu-worker-learner", "ray-head", "ray-gpu-worker"):
        assert compose["services"][name]["environment"]["PCL_API_TOKEN"] == token, name


def test_gpu_runs_are_submitted_to_the_head_as_ray_jobs(compose):
    submit = compose["services"]["submit"]
    assert submit["environment"]["RAY_ADDRESS"] == "http://pcl-head:8265"
    assert submit["entrypoint"][:3] == ["ray", "job", "submit"] and submit["command"][0] == "train"
    assert Path(submit["command"][1]).is_absolute()  # the job's driver does not run in the submitter's dir
    head = compose["services"]["ray-head"]
    assert "--head" in head["command"] and "--block" in head["command"]
    assert {p.rsplit(":", 1)[1] for p in head["ports"]} == {"8265", "8600"}
    assert any(a.startswith("--metrics-export-port=") for a in head["command"])
    # every Ray node shares the tiny build's cache through the runs volume
    for name in ("ray-head", "ray-gpu-worker"):
        assert compose["services"][name]["environment"]["PCL_CACHE"].startswith("/runs/"), name


def test_dependencies_wait_for_health(compose):
    services = compose["services"]
    for name, service in services.items():
        for dependency, condition in (service.get("depends_on") or {}).items():
            assert condition["condition"] == "service_healthy", (name, dependency)
            assert "healthcheck" in services[dependency], (name, dependency)
    assert "redis" in services["ray-cpu-head"]["depends_on"] and "ray-head" in services["ray-gpu-worker"]["depends_on"]
    for name in ("ray-cpu-worker-rollout", "ray-cpu-worker-learner", "submit-cpu"):
        assert "ray-cpu-head" in services[name]["depends_on"], name


def test_cpu_profile_is_the_gpu_profile_without_gpus(compose):
    """A Ray head, workers offering the custom resources the tiny run's placement asks for, a job submitter; the
    tiny run goes in as a Ray job."""
    services = compose["services"]
    cpu = {name for name, s in services.items() if "cpu" in s.get("profiles", [])}
    gpu = {name for name, s in services.items() if "gpu" in s.get("profiles", [])}
    always = {name for name, s in services.items() if not s.get("profiles")}
    assert cpu == {"ray-cpu-head", "ray-cpu-worker-rollout", "ray-cpu-worker-learner"}
    assert gpu == {"ray-head", "ray-gpu-worker"} and always == {"redis", "gcs-redis", "prometheus"}
    # the submitters have profiles of their own: `up` submits nothing, `run` starts the one it names
    assert services["submit-cpu"]["profiles"] == ["cpu-submit"] and services["submit"]["profiles"] == ["gpu-submit"]
    for name in cpu | always | {"submit-cpu"}:
        assert "devices" not in json.dumps(services[name].get("deploy", {})), name
        assert services[name]["image"] != "pcl:gpu", name
    head = services["ray-cpu-head"]
    assert head["build"]["target"] == "cpu" and head["hostname"] == "pcl-head"
    sizing = ("--num-", "--object-store-memory=")  # what differs between a CPU and a GPU head
    assert [a for a in head["command"] if not a.startswith(sizing)] == \
        [a for a in services["ray-head"]["command"] if not a.startswith(sizing)]
    submit = services["submit-cpu"]
    assert submit["entrypoint"] == services["submit"]["entrypoint"]
    assert submit["environment"]["RAY_ADDRESS"] == "http://pcl-head:8265"
    assert submit["command"][:2] == ["train", "/opt/pcl/configs/tiny.yaml"]
    asked: dict[str, float] = {}
    for override in submit["command"]:
        if ".resources=" in override:
            for name, amount in yaml.safe_load(override.split("=", 1)[1]).items():
                asked[name] = asked.get(name, 0) + amount
    offered: dict[str, float] = {}
    for name in ("ray-cpu-worker-rollout", "ray-cpu-worker-learner"):
        flag = next(a for a in services[name]["command"] if a.startswith("--resources="))
        for resource, amount in json.loads(flag.split("=", 1)[1]).items():
            offered[resource] = offered.get(resource, 0) + amount
        assert "--address=pcl-head:6379" in services[name]["command"], name
    # one rollout worker + verifier, two learner ranks (configs/tiny.yaml) + the value scorer
    assert set(asked) == {"rollout", "learner"} and offered["rollout"] >= 1.5 and offered["learner"] >= 2.5


def test_prometheus_scrapes_the_control_plane_and_ray(compose):
    config = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["pcl-control-plane"]["static_configs"][0]["targets"] == ["pcl-head:8600"]
    assert "file_sd_configs" in jobs["ray"]
    # pcl-head resolves in both profiles: the heads' hostname
    assert compose["services"]["ray-head"]["hostname"] == compose["services"]["ray-cpu-head"]["hostname"] == "pcl-head"


def test_mounted_files_exist_and_grafana_gets_the_pcl_dashboard(compose):
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (REPO / source).exists(), (name, source)
    grafana = compose["services"]["grafana"]
    assert "./deploy/grafana/pcl-dashboard.json:/var/lib/grafana/dashboards/pcl-dashboard.json:ro" in grafana["volumes"]
    provider = yaml.safe_load((REPO / "deploy/grafana/provisioning/dashboards/pcl.yaml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    datasource = yaml.safe_load((REPO / "deploy/grafana/provisioning/datasources/prometheus.yaml").read_text())
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"
    dashboard = json.loads((REPO / "deploy/grafana/pcl-dashboard.json").read_text())
    assert any(v["name"] == "DS_PROMETHEUS" and v["type"] == "datasource" for v in dashboard["templating"]["list"])


# -- deploy/kuberay -----------------------------------------------------------------------------------------------

def test_raycluster_and_rayjob_validate_against_the_crds(manifests):
    stored = {kind: validate(obj) for (kind, _), obj in manifests.items() if kind in ("RayCluster", "RayJob")}
    assert set(stored) == {"RayCluster", "RayJob"}


def test_raycluster_keeps_its_gcs_state_in_a_redis_of_its_own(manifests):
    """KubeRay's gcsFaultToleranceOptions on gcs-redis.yaml's Service and Secret, within the rules KubeRay's
    validation adds to the CRD's schema (ray-operator/controllers/ray/utils/validation.go): with these options the
    head sets neither REDIS_PASSWORD, RAY_REDIS_ADDRESS nor rayStartParams' redis-password (KubeRay does)."""
    cluster = manifests[("RayCluster", "pcl")]
    options = validate(cluster)["spec"]["gcsFaultToleranceOptions"]
    host, port = options["redisAddress"].split(":")
    service = manifests[("Service", host)]["spec"]
    assert service["ports"][0]["port"] == int(port) and service["selector"] == {"app.kubernetes.io/name": host}
    redis = manifests[("StatefulSet", host)]["spec"]["template"]["spec"]["containers"][0]
    secret = options["redisPassword"]["valueFrom"]["secretKeyRef"]
    assert secret == {"name": "pcl-gcs-redis", "key": "password"}
    assert {e["name"]: e["valueFrom"]["secretKeyRef"] for e in redis["env"] if "valueFrom" in e} == \
        {"REDIS_PASSWORD": secret, "REDISCLI_AUTH": secret}
    assert redis["args"] == manifests[("StatefulSet", "pcl-redis")]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "externalStorageNamespace" not in options  # KubeRay's default: the RayCluster's UID
    head = cluster["spec"]["headGroupSpec"]
    names = {e["name"] for e in head["template"]["spec"]["containers"][0]["env"]}
    assert not names & {"REDIS_PASSWORD", "RAY_REDIS_ADDRESS", "REDIS_USERNAME"}, names
    assert "redis-password" not in head["rayStartParams"]
    for group in cluster["spec"]["workerGroupSpecs"]:  # KubeRay's 600 s applies where the env sets none
        env = {e["name"] for e in group["template"]["spec"]["containers"][0]["env"]}
        assert "RAY_gcs_rpc_server_reconnect_timeout_s" not in env, group["groupName"]
    bad = json.loads(json.dumps(cluster))
    bad["spec"]["gcsFaultToleranceOptions"]["backend"] = "etcd"
    with pytest.raises(jsonschema.ValidationError, match="etcd"):
        validate(bad)


def test_every_raycluster_node_takes_the_run_configs_health_checks_from_its_environment(manifests):
    """As on compose: the head's GCS runs the health checks that declare a node dead, so the RayCluster's nodes
    carry the `ray` section's health-check defaults in their environment (docs/operations.md, "Timeouts on a
    cluster"); the head reconnect timeout is KubeRay's own 600 s with GCS fault tolerance (the test above). And the
    bounds on Ray's own growth, as on compose."""
    from actors.runtime import RAY_LIMITS
    from pcl.config_ray import RayConfig

    wanted = {k: v for k, v in RayConfig().ray_start_env().items() if k.startswith("RAY_health_check")}
    spec = manifests[("RayCluster", "pcl")]["spec"]
    groups = {"head": spec["headGroupSpec"], **{g["groupName"]: g for g in spec["workerGroupSpecs"]}}
    for name, group in groups.items():
        env = {e["name"]: e.get("value") for e in group["template"]["spec"]["containers"][0]["env"]}
        assert wanted.items() <= env.items(), (name, sorted(env))
        assert RAY_LIMITS.items() <= env.items(), (name, sorted(env))  # Ray's own growth bounded (Long runs)


def test_crd_validator_rejects_unknown_fields_and_wrong_types(manifests):
    cluster = json.loads(json.dumps(manifests[("RayCluster", "pcl")]))
    cluster["spec"]["headGroupSpec"]["rayStartParam"] = {"num-cpus": "0"}  # a typo the server would prune
    with pytest.raises(jsonschema.ValidationError, match="rayStartParam"):
        validate(cluster)
    cluster = json.loads(json.dumps(manifests[("RayCluster", "pcl")]))
    cluster["spec"]["workerGroupSpecs"][0]["replicas"] = "one"
    with pytest.raises(jsonschema.ValidationError):
        validate(cluster)
    job = json.loads(json.dumps(manifests[("RayJob", "pcl-train")]))
    job["spec"]["entrypoint"] = ["pcl", "train"]
    with pytest.raises(jsonschema.ValidationError):
        validate(job)


def test_int_or_string_quantities_take_either_and_nothing_else(manifests):
    cluster = json.loads(json.dumps(manifests[("RayCluster", "pcl")]))
    container = cluster["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    limits = container["resources"]["limits"]
    limits["nvidia.com/gpu"] = 8  # an int-or-string quantity: 8 and "8" are both valid
    validate(cluster)
    limits["nvidia.com/gpu"] = [8]
    with pytest.raises(jsonschema.ValidationError):
        validate(cluster)


def test_defaults_are_applied_and_nulls_dropped(manifests):
    job = json.loads(json.dumps(manifests[("RayJob", "pcl-train")]))
    job["spec"].pop("submissionMode")
    job["spec"]["runtimeEnvYAML"] = None
    stored = validate(job)
    assert stored["spec"]["submissionMode"] == "K8sJobMode" and "runtimeEnvYAML" not in stored["spec"]


def test_rayjob_runs_pcl_train_on_the_cluster_with_its_configmap(manifests):
    job = manifests[("RayJob", "pcl-train")]["spec"]
    assert job["submissionMode"] in submission_modes(manifests[("RayJob", "pcl-train")]["apiVersion"])
    assert job["entrypoint"].startswith("pcl train /config/run.yaml")
    assert job["clusterSelector"] == {"ray.io/cluster": "pcl"}
    head = manifests[("RayCluster", "pcl")]["spec"]["headGroupSpec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in head["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in head["volumes"]}
    assert mounts["run-config"] == "/config" and volumes["run-config"]["configMap"]["name"] == "pcl-run-config"
    assert ("ConfigMap", "pcl-run-config") in manifests


def test_run_config_in_the_configmap_is_a_valid_run_config(manifests, tmp_path):
    from pcl.config import load_config

    path = tmp_path / "run.yaml"
    path.write_text(manifests[("ConfigMap", "pcl-run-config")]["data"]["run.yaml"])
    cfg = load_config(path)
    assert (cfg.run.m, cfg.run.n, cfg.selection.type) == (512, 16, "pcl")
    assert cfg.rollout.resources and cfg.learner.resources  # placed on the GPU group's resources
    worker = manifests[("RayCluster", "pcl")]["spec"]["workerGroupSpecs"][0]
    offered = json.loads(json.loads(worker["rayStartParams"]["resources"]))
    assert set(cfg.rollout.resources) <= set(offered) and set(cfg.learner.resources) <= set(offered)


def test_run_config_fits_the_worker_group(manifests, tmp_path):
    """Every actor the run places on GPUs or custom resources fits the worker pods: nothing pends for ever."""
    from pcl.config import load_config

    path = tmp_path / "run.yaml"
    path.write_text(manifests[("ConfigMap", "pcl-run-config")]["data"]["run.yaml"])
    cfg = load_config(path)
    group = manifests[("RayCluster", "pcl")]["spec"]["workerGroupSpecs"][0]
    pods = group["replicas"]
    gpus_per_pod = int(group["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
    offered = json.loads(json.loads(group["rayStartParams"]["resources"]))
    # (count, GPUs each, custom resources each); the value scorer holds learner.num_gpus_per_rank GPUs itself
    actors = [(cfg.rollout.num_workers, cfg.rollout.num_gpus_per_worker, cfg.rollout.resources),
              (cfg.learner.num_ranks, cfg.learner.num_gpus_per_rank, cfg.learner.resources),
              (1, cfg.learner.num_gpus_per_rank, cfg.value.resources),
              (cfg.verifier.num_workers, 0, cfg.verifier.resources)]
    assert sum(count * gpus for count, gpus, _ in actors) <= gpus_per_pod * pods
    demand: dict[str, float] = {}
    for count, _, resources in actors:
        for name, amount in resources.items():
            demand[name] = demand.get(name, 0) + count * amount
    for name, amount in demand.items():
        assert amount <= offered.get(name, 0) * pods, (name, amount, offered)
    # the compose GPU worker offers the same slots, so the same run config places there too
    compose_worker = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]["ray-gpu-worker"]
    flag = next(a for a in compose_worker["command"] if a.startswith("--resources="))
    assert json.loads(flag.split("=", 1)[1]) == offered


def test_head_schedules_no_work_and_workers_request_gpus(manifests):
    spec = manifests[("RayCluster", "pcl")]["spec"]
    assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    worker = spec["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"]
    assert worker["limits"]["nvidia.com/gpu"] == worker["requests"]["nvidia.com/gpu"]
    ports = {p["name"]: p["containerPort"] for p in spec["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"]}
    assert ports["pcl"] == 8600 and ports["dashboard"] == 8265


def test_redis_secret_and_podmonitor(manifests):
    redis = manifests[("StatefulSet", "pcl-redis")]["spec"]["template"]["spec"]["containers"][0]
    assert "--appendonly" in redis["args"] and redis["readinessProbe"]["exec"]["command"] == ["redis-cli", "ping"]
    assert ("Service", "pcl-redis") in manifests
    env = manifests[("RayCluster", "pcl")]["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]
    token = next(e for e in env if e["name"] == "PCL_API_TOKEN")
    assert token["valueFrom"]["secretKeyRef"] == {"name": "pcl-api-token", "key": "token"}
    monitor = manifests[("PodMonitor", "pcl-head")]["spec"]
    assert monitor["selector"]["matchLabels"]["ray.io/node-type"] == "head"
    assert {e["port"] for e in monitor["podMetricsEndpoints"]} == {"pcl", "metrics"}
    assert manifests[("PersistentVolumeClaim", "pcl-runs")]["spec"]["accessModes"] == ["ReadWriteMany"]
