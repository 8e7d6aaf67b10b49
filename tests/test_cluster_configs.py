"""cluster/: the Ray cluster launcher config and the KubeRay manifests pass Ray's own config
validation and KubeRay's published CRD schemas, agree with each other, and name only
images, files and commands that the repository and cluster/README.md have.

No network and no cloud credentials: Ray's validation runs on the installed ``ray``, the
CRDs are fixtures (tests/data/kuberay/SOURCE.md), EC2 instance facts come from the
DescribeInstanceTypes data that ``moto`` ships.
"""

from __future__ import annotations

import copy
import functools
import gzip
import hashlib
import importlib.util
import json
import re
import shlex
from pathlib import Path
from typing import Any, Callable, Iterator

import jsonschema
import pytest
import yaml

from support import k8s_schema

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "cluster"
LAUNCHER = CLUSTER / "aws-gpu.yaml"
KUBERAY = CLUSTER / "kuberay"
DOCKERFILE = CLUSTER / "Dockerfile"
README = (CLUSTER / "README.md").read_text(encoding="utf-8")
CRD_DIR = ROOT / "tests" / "data" / "kuberay"
CRD_FILES = {
    "RayCluster": "ray.io_rayclusters.yaml",
    "RayJob": "ray.io_rayjobs.yaml",
    "RayCronJob": "ray.io_raycronjobs.yaml",
}


# Name limits the KubeRay v1.7.0 operator enforces (utils/constant.go): a RayJob's cluster
# and a RayCronJob's RayJobs get suffixes, so their own names must be shorter.
MAX_NAME = {"RayCluster": 53, "RayJob": 47, "RayCronJob": 36}
DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


@functools.lru_cache(maxsize=None)
def _parsed(path: Path) -> tuple[Any, ...]:
    with open(path, encoding="utf-8") as f:
        return tuple(d for d in yaml.load_all(f, Loader=_LOADER) if d is not None)


def _docs(path: Path) -> list[Any]:
    """The YAML documents of a file (parsed once; each call returns fresh copies)."""
    return copy.deepcopy(list(_parsed(path)))


def _launcher() -> dict[str, Any]:
    return _docs(LAUNCHER)[0]


def _manifests() -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{path.name}:{obj['kind']}", obj)
        for path in sorted(KUBERAY.glob("*.yaml"))
        for obj in _docs(path)
    ]


def _by_kind(kind: str) -> dict[str, Any]:
    (obj,) = [o for _, o in _manifests() if o["kind"] == kind]
    return obj


def _walk(node: Any) -> Iterator[dict[str, Any]]:
    """Every mapping inside ``node``, depth first."""
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def _cluster_specs() -> list[tuple[str, dict[str, Any]]]:
    """(where, RayClusterSpec) for every cluster spec the manifests carry."""
    job = _by_kind("RayJob")
    cron = _by_kind("RayCronJob")
    return [
        ("raycluster.yaml", _by_kind("RayCluster")["spec"]),
        ("rayjob-nightly.yaml", job["spec"]["rayClusterSpec"]),
        ("raycronjob-nightly.yaml", cron["spec"]["jobTemplate"]["rayClusterSpec"]),
    ]


def _groups(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {"head": spec["headGroupSpec"], **{g["groupName"]: g for g in spec["workerGroupSpecs"]}}


@pytest.fixture(scope="module")
def crd_validators() -> dict[str, tuple[dict, Any]]:
    """kind -> (CRD, validator of its v1 schema); loading the CRDs takes about a second."""
    out = {}
    for kind, name in CRD_FILES.items():
        crd = k8s_schema.load_crd(CRD_DIR / name)
        assert crd["spec"]["names"]["kind"] == kind
        out[kind] = (crd, k8s_schema.validator_for(crd, "v1"))
    return out


# --- every YAML file loads ----------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(CLUSTER.rglob("*.yaml")), ids=_rel)
def test_yaml_loads(path):
    with open(path, encoding="utf-8") as f:
        docs = [d for d in yaml.safe_load_all(f) if d is not None]
    assert docs, f"{_rel(path)} holds no document"
    assert all(isinstance(d, dict) for d in docs), f"{_rel(path)}: a document is not a mapping"


def test_expected_files_are_there():
    assert {p.name for p in KUBERAY.glob("*.yaml")} == {
        "prerequisites.yaml",
        "raycluster.yaml",
        "rayjob-nightly.yaml",
        "raycronjob-nightly.yaml",
    }
    assert LAUNCHER.is_file() and DOCKERFILE.is_file()


# --- the Ray cluster launcher config --------------------------------------------------------


def _ray_validate(config: dict[str, Any]) -> None:
    # Ray's own check (jsonschema against ray/autoscaler/ray-schema.json, then the node-type
    # rules); `ray up` runs it on the config after prepare_config. Both are Ray internals:
    # Ray exposes no public validation call.
    from ray.autoscaler._private.util import validate_config

    validate_config(config)


def test_launcher_passes_ray_validation():
    from ray.autoscaler._private.util import prepare_config

    raw = _launcher()
    _ray_validate(copy.deepcopy(raw))
    prepared = prepare_config(copy.deepcopy(raw))  # merges Ray's AWS defaults; offline
    _ray_validate(prepared)
    # Ray's AWS defaults install a Ray wheel in setup_commands: the explicit empty lists
    # must survive the merge, and the image must stay ours.
    for key in ("setup_commands", "head_setup_commands", "worker_setup_commands"):
        assert prepared[key] == [], key
    assert prepared["docker"]["image"] == raw["docker"]["image"]
    assert prepared["available_node_types"]["head"]["max_workers"] == 0


def _ec2_instance_types() -> dict[str, dict[str, Any]]:
    """EC2 DescribeInstanceTypes records by instance type, as captured in moto's data."""
    spec = importlib.util.find_spec("moto")
    path = Path(spec.submodule_search_locations[0]) / "ec2" / "resources" / "instance_types.json.gz"
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture()
def ray_detected(monkeypatch) -> Callable[[dict[str, str]], dict[str, dict[str, int]]]:
    """Ray's own AWS resource detection (what `ray up` fills in for each node type), fed
    with the instance-type records of moto's data in place of EC2's live answer (the one
    call that would need AWS). Takes {node type: instance type}; returns {node type:
    resources}, without the memory figure."""
    from ray.autoscaler._private.aws import node_provider

    records = list(_ec2_instance_types().values())
    monkeypatch.setattr(
        node_provider, "list_ec2_instances", lambda region, credentials=None: records
    )

    def detect(instance_types: dict[str, str]) -> dict[str, dict[str, int]]:
        config = {
            "provider": {"type": "aws", "region": "us-west-2"},
            "head_node_type": "_head",
            "available_node_types": {
                name: {"node_config": {"InstanceType": itype}, "resources": {}}
                for name, itype in {"_head": "m6i.large", **instance_types}.items()
            },
        }
        filled = node_provider.AWSNodeProvider.fillout_available_node_types_resources(config)
        return {
            name: {k: v for k, v in node["resources"].items() if k != "memory"}
            for name, node in filled["available_node_types"].items()
            if name != "_head"
        }

    return detect


def test_launcher_declared_resources_match_instance_types(ray_detected):
    config = _launcher()
    types = config["available_node_types"]
    detected = ray_detected({name: t["node_config"]["InstanceType"] for name, t in types.items()})
    for name, node_type in types.items():
        if name == config["head_node_type"]:
            assert node_type["resources"] == {"CPU": 0}, "the head advertises no CPU"
        else:
            assert node_type["resources"] == detected[name], f"{name}: Ray detects {detected[name]}"
    gpu = types["gpu_workers"]["resources"]
    assert gpu["GPU"] >= 1 and any(k.startswith("accelerator_type:") for k in gpu)


def _set(path: str, value: Any) -> Callable[[Any], None]:
    """A change that sets the field at a dotted path ("a.b.0.c": numbers index lists)."""

    def step(node: Any, key: str) -> Any:
        return int(key) if isinstance(node, list) else key

    def change(obj: Any) -> None:
        *parents, last = path.split(".")
        for key in parents:
            obj = obj[step(obj, key)]
        obj[step(obj, last)] = value

    return change


@pytest.mark.parametrize(
    "change, error",
    [
        (_set("max_worker", 3), "'max_worker' was unexpected"),
        (_set("available_node_types.gpu_workers.min_worker", 1), "'min_worker' was unexpected"),
        (
            _set("available_node_types.gpu_workers.min_workers", "one"),
            "'one' is not of type 'integer'",
        ),
        (
            _set("available_node_types.gpu_workers.resources.GPU", 0.5),
            "0.5 is not of type 'integer'",
        ),
        (_set("docker.imagee", "x"), "'imagee' was unexpected"),
        (
            _set("available_node_types.cpu_workers.min_workers", 20),
            "smaller than the sum of `min_workers`",
        ),
        (_set("head_node_type", "gpu_head"), "must be one of `available_node_types`"),
    ],
    ids=[
        "top-level typo",
        "node-type typo",
        "wrong type",
        "fractional GPU",
        "docker typo",
        "min over max",
        "unknown head type",
    ],
)
def test_launcher_validation_fails_on_bad_config(change, error):
    config = _launcher()
    change(config)
    with pytest.raises((jsonschema.ValidationError, ValueError), match=re.escape(error)):
        _ray_validate(config)


# --- the KubeRay manifests -----------------------------------------------------------------


def test_crd_fixtures_match_their_checksums():
    source = (CRD_DIR / "SOURCE.md").read_text(encoding="utf-8")
    listed = dict(re.findall(r"^\| `([^`]+)` \| `([0-9a-f]{64})` \|$", source, re.M))
    assert set(listed) == set(CRD_FILES.values()) | {"LICENSE"}
    for name, digest in listed.items():
        assert hashlib.sha256((CRD_DIR / name).read_bytes()).hexdigest() == digest, name


# Kubernetes core objects have no CRD; these schemas list the fields of the Kubernetes
# API reference (core/v1 ServiceAccount, PersistentVolumeClaim) that a manifest may use,
# with the same strictness as the CRD check.
_META = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string"},
        "namespace": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}
_QUANTITY = {"anyOf": [{"type": "integer"}, {"type": "string", "pattern": k8s_schema.QUANTITY}]}
CORE_SCHEMAS = {
    "ServiceAccount": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"enum": ["v1"]},
            "kind": {"enum": ["ServiceAccount"]},
            "metadata": _META,
            "automountServiceAccountToken": {"type": "boolean"},
            "imagePullSecrets": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}},
                    "additionalProperties": False,
                },
            },
            "secrets": {"type": "array", "items": {"type": "object"}},
        },
    },
    "PersistentVolumeClaim": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"enum": ["v1"]},
            "kind": {"enum": ["PersistentVolumeClaim"]},
            "metadata": _META,
            "spec": {
                "type": "object",
                "required": ["accessModes", "resources"],
                "additionalProperties": False,
                "properties": {
                    "accessModes": {
                        "type": "array",
                        "minItems": 1,
                        "uniqueItems": True,
                        "items": {
                            "enum": [
                                "ReadWriteOnce",
                                "ReadOnlyMany",
                                "ReadWriteMany",
                                "ReadWriteOncePod",
                            ]
                        },
                    },
                    "resources": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["requests"],
                        "properties": {
                            "requests": {
                                "type": "object",
                                "required": ["storage"],
                                "additionalProperties": _QUANTITY,
                            },
                            "limits": {"type": "object", "additionalProperties": _QUANTITY},
                        },
                    },
                    "storageClassName": {"type": "string"},
                    "volumeAttributesClassName": {"type": "string"},
                    "volumeMode": {"enum": ["Filesystem", "Block"]},
                    "volumeName": {"type": "string"},
                    "selector": {"type": "object"},
                    "dataSource": {"type": "object"},
                    "dataSourceRef": {"type": "object"},
                },
            },
        },
    },
}


def _schema_errors(obj: dict[str, Any], crd_validators) -> list[str]:
    kind = obj.get("kind")
    if kind in CORE_SCHEMAS:
        return k8s_schema.errors(jsonschema.Draft4Validator(CORE_SCHEMAS[kind]), obj)
    crd, validator = crd_validators[kind]
    api_version = f"{crd['spec']['group']}/v1"
    if obj.get("apiVersion") != api_version:
        return [f"apiVersion: {obj.get('apiVersion')!r}, expected {api_version!r}"]
    return k8s_schema.errors(validator, obj)


@pytest.mark.parametrize("where, obj", _manifests(), ids=[w for w, _ in _manifests()])
def test_manifest_matches_schema(where, obj, crd_validators):
    assert obj.get("kind") in CORE_SCHEMAS or obj.get("kind") in CRD_FILES, f"{where}: unknown kind"
    assert _schema_errors(obj, crd_validators) == []


def _in_gpu_pod(path: str) -> str:
    return f"spec.rayClusterSpec.workerGroupSpecs.0.template.spec.{path}"


@pytest.mark.parametrize(
    "kind, change, expected",
    [
        (
            "RayJob",
            _set("spec.shutdownAfterJobFinish", True),
            "spec: Additional properties are not allowed ('shutdownAfterJobFinish' was unexpected)",
        ),
        (
            "RayJob",
            _set("spec.ttlSecondsAfterFinished", "600"),
            "spec.ttlSecondsAfterFinished: '600' is not of type 'integer'",
        ),
        (
            "RayJob",
            _set("spec.ttlSecondsAfterFinished", 2**31),
            "spec.ttlSecondsAfterFinished: 2147483648 is not a 'int32'",
        ),
        (
            "RayJob",
            _set(_in_gpu_pod("nodeSelektor"), {}),
            "spec.rayClusterSpec.workerGroupSpecs[0].template.spec: Additional properties are not "
            "allowed ('nodeSelektor' was unexpected)",
        ),
        (
            "RayJob",
            _set(_in_gpu_pod("volumes.1.name"), "models"),
            "spec.rayClusterSpec.workerGroupSpecs[0].template.spec.volumes: items 0 and 1 share the key",
        ),
        (
            "RayJob",
            _set(_in_gpu_pod("containers.0.resources.limits.cpu"), "7 cores"),
            "spec.rayClusterSpec.workerGroupSpecs[0].template.spec.containers[0].resources.limits.cpu: "
            "'7 cores' does not match",
        ),
        (
            "RayCluster",
            _set("spec.workerGroupSpecs.0.maxReplicas", "four"),
            "spec.workerGroupSpecs[0].maxReplicas: 'four' is not of type 'integer'",
        ),
        (
            "RayCluster",
            _set("spec.autoscalerOptions.upscalingMode", "Fast"),
            "spec.autoscalerOptions.upscalingMode: 'Fast' is not one of",
        ),
        (
            "RayCronJob",
            _set("spec.jobTemplate.entrypoints", "x"),
            "spec.jobTemplate: Additional properties are not allowed ('entrypoints' was unexpected)",
        ),
        (
            "PersistentVolumeClaim",
            _set("spec.accessModes", ["ReadManyWrite"]),
            "spec.accessModes[0]: 'ReadManyWrite' is not one of",
        ),
        (
            "ServiceAccount",
            _set("metadata.annotation", {}),
            "metadata: Additional properties are not allowed ('annotation' was unexpected)",
        ),
    ],
    ids=[
        "typo",
        "wrong type",
        "int32 overflow",
        "typo deep in the pod spec",
        "duplicate list-map key",
        "bad quantity",
        "cluster wrong type",
        "bad enum",
        "cron typo",
        "pvc bad enum",
        "service account typo",
    ],
)
def test_schema_check_fails_on_bad_manifest(kind, change, expected, crd_validators):
    obj = copy.deepcopy(_by_kind(kind))
    change(obj)
    found = _schema_errors(obj, crd_validators)
    assert len(found) == 1 and found[0].startswith(expected), found


def test_embedded_copies_are_identical():
    cluster, job, cron = (_by_kind(k) for k in ("RayCluster", "RayJob", "RayCronJob"))
    assert job["spec"]["rayClusterSpec"] == cluster["spec"], (
        "rayjob-nightly.yaml's rayClusterSpec differs from raycluster.yaml's spec"
    )
    assert cron["spec"]["jobTemplate"] == job["spec"], (
        "raycronjob-nightly.yaml's jobTemplate differs from rayjob-nightly.yaml's spec"
    )


def test_operator_rules():
    """A few of the KubeRay v1.7.0 operator's own checks (utils/validation.go) that the CRD
    schema cannot express."""
    for kind in MAX_NAME:
        name = _by_kind(kind)["metadata"]["name"]
        assert len(name) <= MAX_NAME[kind] and DNS_1035.fullmatch(name), (kind, name)
    for where, spec in _cluster_specs():
        for group_name, group in _groups(spec).items():
            start = group.get("rayStartParams", {})
            assert not (
                group.get("resources")
                and {"num-cpus", "num-gpus", "memory", "resources"} & set(start)
            ), f"{where} {group_name}: resources in both `resources` and rayStartParams"
            assert "labels" not in start, f"{where} {group_name}: use the `labels` field"
            assert group["template"]["spec"]["containers"], f"{where} {group_name}: no container"
            if group_name != "head":
                assert (
                    0 <= group["minReplicas"] <= group.get("replicas", 0) <= group["maxReplicas"]
                ), f"{where} {group_name}: replicas out of [minReplicas, maxReplicas]"
    job = _by_kind("RayJob")["spec"]
    assert job["shutdownAfterJobFinishes"] is True and job["ttlSecondsAfterFinished"] >= 0
    assert job["activeDeadlineSeconds"] > 0
    assert isinstance(yaml.safe_load(job["runtimeEnvYAML"]), dict)
    cron = _by_kind("RayCronJob")["spec"]
    assert len(cron["schedule"].split()) == 5 and cron["timeZone"]


def test_cluster_layout_and_identity():
    """The design the README promises: a head with no CPU for tasks, a GPU group that asks
    for GPUs of one named type on tolerated GPU nodes, the model volume read-only in every
    pod, and object-storage access through the service account."""
    service_account = _by_kind("ServiceAccount")
    claim = _by_kind("PersistentVolumeClaim")["metadata"]["name"]
    assert "eks.amazonaws.com/role-arn" in service_account["metadata"]["annotations"]
    for where, spec in _cluster_specs():
        groups = _groups(spec)
        assert groups["head"]["rayStartParams"]["num-cpus"] == "0", where
        gpu = groups["gpu"]
        limits = gpu["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert int(limits["nvidia.com/gpu"]) >= 1, where
        assert [k for k in gpu["resources"] if k.startswith("accelerator_type:")], where
        assert any(t["key"] == "nvidia.com/gpu" for t in gpu["template"]["spec"]["tolerations"])
        assert "nvidia.com/gpu" not in json.dumps(groups["cpu"]), (
            f"{where}: GPU asked for by the CPU group"
        )
        for group_name, group in groups.items():
            pod = group["template"]["spec"]
            assert pod["serviceAccountName"] == service_account["metadata"]["name"], (
                where,
                group_name,
            )
            volumes = {v["name"]: v for v in pod["volumes"]}
            mounts = [
                m for m in pod["containers"][0]["volumeMounts"] if m["mountPath"] == "/mnt/models"
            ]
            assert len(mounts) == 1 and mounts[0]["readOnly"] is True, (where, group_name)
            source = volumes[mounts[0]["name"]]["persistentVolumeClaim"]
            assert source == {"claimName": claim, "readOnly": True}, (where, group_name)


def test_kuberay_gpu_pods_fit_their_instance_type(ray_detected):
    """The GPU group's Ray GPU type is the one on the instance type it selects, and its pod
    asks for no more GPUs, CPUs or memory than that instance has."""
    instances = _ec2_instance_types()
    for where, spec in _cluster_specs():
        gpu = _groups(spec)["gpu"]
        pod = gpu["template"]["spec"]
        instance = pod["nodeSelector"]["node.kubernetes.io/instance-type"]
        detected = ray_detected({"gpu": instance})["gpu"]
        declared_type = {
            k: int(v) for k, v in gpu["resources"].items() if k.startswith("accelerator_type:")
        }
        assert declared_type == {
            k: v for k, v in detected.items() if k.startswith("accelerator_type:")
        }, where
        limits = pod["containers"][0]["resources"]["limits"]
        assert int(limits["nvidia.com/gpu"]) <= detected["GPU"], where
        assert float(limits["cpu"]) < detected["CPU"], where
        assert limits["memory"].endswith("Gi"), where
        assert int(limits["memory"][:-2]) * 1024 < instances[instance]["MemoryInfo"]["SizeInMiB"], (
            where
        )


CREDENTIAL_PATTERNS = [
    re.compile(r"AKIA[0-9A-Z]{16}"),  # AWS access key id
    re.compile(r"(?i)aws_(secret_access_key|session_token)|secretKeyRef|ssh_private_key:"),
    re.compile(r"(?i)-----BEGIN [A-Z ]*PRIVATE KEY-----"),
]


@pytest.mark.parametrize("path", [p for p in sorted(CLUSTER.rglob("*")) if p.is_file()], ids=_rel)
def test_no_credentials_in_cluster_files(path):
    text = "\n".join(
        line
        for line in path.read_text(encoding="utf-8").splitlines()
        if not line.lstrip().startswith("#")
    )
    for pattern in CREDENTIAL_PATTERNS:
        assert not pattern.search(text), f"{_rel(path)}: {pattern.pattern}"


# --- images, versions, files and commands ----------------------------------------------------


def _dockerfile() -> dict[str, Any]:
    text = DOCKERFILE.read_text(encoding="utf-8")
    return {
        "from": re.findall(r"^FROM\s+(\S+)", text, re.M),
        "workdir": re.findall(r"^WORKDIR\s+(\S+)", text, re.M),
        "ray_pin": re.findall(r'"ray\[[a-z,]+\]==([0-9.]+)"', text),
    }


def _images() -> dict[str, set[str]]:
    """Image -> where it is named, over the launcher config and the manifests."""
    found: dict[str, set[str]] = {}
    docker = _launcher()["docker"]
    for key in ("image", "head_image", "worker_image"):
        if key in docker:
            found.setdefault(docker[key], set()).add(f"aws-gpu.yaml docker.{key}")
    for name, node_type in _launcher()["available_node_types"].items():
        if "worker_image" in node_type.get("docker", {}):
            found.setdefault(node_type["docker"]["worker_image"], set()).add(f"aws-gpu.yaml {name}")
    for where, obj in _manifests():
        for node in _walk(obj):
            for key in ("containers", "initContainers"):
                for container in node.get(key, []) if isinstance(node.get(key), list) else []:
                    found.setdefault(container["image"], set()).add(where)
            if "autoscalerOptions" in node and "image" in node["autoscalerOptions"]:
                found.setdefault(node["autoscalerOptions"]["image"], set()).add(where)
    return found


def test_one_image_everywhere_and_in_the_readme():
    images = _images()
    assert len(images) == 1, f"several images named: {images}"
    (image,) = images
    assert re.fullmatch(r"[a-z0-9.-]+(:[0-9]+)?/[a-z0-9/._-]+:[\w.-]+", image), image
    for name in [image, *_dockerfile()["from"]]:
        assert f"`{name}`" in README or f" {name}" in README, f"{name} is not in cluster/README.md"
    assert f"-t {image} ." in README, (
        "the README's docker build does not tag the image the configs use"
    )


def test_ray_and_python_versions_agree():
    docker = _dockerfile()
    (base,) = docker["from"]
    match = re.fullmatch(r"rayproject/ray:([0-9.]+)-py3(\d+)-gpu", base)
    assert match, f"not an official Ray GPU image: {base}"
    version = match.group(1)
    assert docker["ray_pin"] == [version], "the Dockerfile's Ray pin differs from its base image"
    for where, spec in _cluster_specs():
        assert spec["rayVersion"] == version, where
    assert f"ray[default]=={version}" in README


def test_rayjob_working_dir_is_the_images_copy():
    (workdir,) = _dockerfile()["workdir"]
    job = _by_kind("RayJob")["spec"]
    assert yaml.safe_load(job["runtimeEnvYAML"])["working_dir"] == workdir


def _entrypoints() -> list[str]:
    return [
        _by_kind("RayJob")["spec"]["entrypoint"],
        _by_kind("RayCronJob")["spec"]["jobTemplate"]["entrypoint"],
    ]


def test_entrypoints_are_in_the_readme():
    for entrypoint in _entrypoints():
        assert entrypoint in README, entrypoint
        assert shlex.split(entrypoint)[:2] == ["python", "jobs/nightly.py"]


_CODE_BLOCK = re.compile(r"```(?:bash|yaml)?\n(.*?)```", re.S)
_REPO_PATH = re.compile(r"(?<![\w/.])((?:cluster|jobs|tests|docs|examples)/[\w./-]*\w)")


def _readme_code() -> str:
    return "\n".join(_CODE_BLOCK.findall(README))


def _named_paths() -> list[str]:
    """Repository paths named by the entry points and the README's commands."""
    texts = [*_entrypoints(), _readme_code()]
    return sorted({p for text in texts for p in _REPO_PATH.findall(text)})


@pytest.mark.parametrize("path", _named_paths())
def test_named_files_exist(path):
    assert (ROOT / path).exists(), f"{path} is named in cluster/ but is not in the repository"


def _readme_subcommands() -> list[str]:
    return sorted(set(re.findall(r"^\s*ragbatch (\w+)", _readme_code(), re.M)))


@pytest.mark.parametrize("subcommand", _readme_subcommands())
def test_readme_ragbatch_subcommands_exist(subcommand):
    import argparse

    from ragbatch.cli.main import _parser

    (sub,) = [a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert subcommand in sub.choices, f"`ragbatch {subcommand}` is not a command"
