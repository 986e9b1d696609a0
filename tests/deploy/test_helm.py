"""The Helm chart (helm/kafka-consumer-gateway): lint, render with several value sets, validate every
rendered object, and check what the deployment must guarantee.

Rendering and linting use helm-python-sdk (the Helm v4 SDK in-process: no helm binary, no cluster).
Core objects are validated with kubernetes-validate in strict mode (unknown fields are errors) against
the oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest the package has schemas
for. ServiceMonitor and PrometheusRule are Prometheus Operator CRDs, absent from those schemas: they are
checked against the subset of the CRDs' schemas written out below (the fields the chart uses, unknown
fields rejected).
"""

from __future__ import annotations

import base64
import copy
import re
import uuid
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version
from yamllint import linter
from yamllint.config import YamlLintConfig

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "kafka-consumer-gateway"
CHART_ALERTS = CHART / "files" / "alerts.yaml"
REPO_ALERTS = ROOT / "dashboards" / "alerts.yaml"
RELEASE, NAMESPACE = "gw", "streaming"
K8S_VERSIONS = ("1.25.0", latest_version())  # Chart.yaml kubeVersion floor, and the newest schemas
REPLICA_ID = re.compile(r"[A-Za-z0-9-]{1,40}")
WORKLOADS = ("StatefulSet", "Deployment")
BOOTSTRAP = "kafka-0.kafka.kafka.svc:9092,kafka-1.kafka.kafka.svc:9092"

VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {"kafka": {"bootstrap": BOOTSTRAP}},
    "hpa-pdb": {
        "kafka": {"bootstrap": BOOTSTRAP},
        "autoscaling": {"enabled": True, "minReplicas": 3, "maxReplicas": 12, "targetCPUUtilizationPercentage": 60,
                        "targetMemoryUtilizationPercentage": 85},
        "podDisruptionBudget": {"enabled": True, "maxUnavailable": None, "minAvailable": "50%"},
    },
    "monitoring": {
        "kafka": {"bootstrap": BOOTSTRAP},
        "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}, "interval": "15s",
                           "metricRelabelings": [{"action": "drop", "sourceLabels": ["__name__"],
                                                  "regex": "kcg_http_request_duration_seconds_bucket"}]},
        "prometheusRule": {"enabled": True, "labels": {"release": "prometheus"},
                           "extraGroups": [{"name": "site", "rules": [
                               {"alert": "GatewayPodsMissing", "expr": "absent(up{job='gw-kafka-consumer-gateway'})",
                                "for": "5m", "labels": {"severity": "page"}}]}]},
    },
    "monitoring-legacy-operator": {
        "kafka": {"bootstrap": BOOTSTRAP},
        "serviceMonitor": {"enabled": True, "authMode": "bearerTokenSecret"},
        "prometheusRule": {"enabled": True},
    },
    "tenants-sasl-tls": {
        "kafka": {
            "bootstrap": "b-1.msk.example.com:9096,b-2.msk.example.com:9096",
            "securityProtocol": "SASL_SSL",
            "sasl": {"mechanism": "SCRAM-SHA-512", "username": "gateway", "password": "s3cr3t-sasl"},
            "tls": {"secretName": "kafka-client-tls", "caKey": "ca.crt", "certKey": "tls.crt", "keyKey": "tls.key",
                    "keyPassword": "key-pass"},
        },
        "tenants": {"file": (ROOT / "examples" / "tenants.yaml").read_text()},
        "auth": {"adminToken": "admin-token-from-values", "peerToken": "peer-token-from-values"},
        "gateway": {"publicUrl": "https://kafka-gw.example.com", "forwardedAllowIps": "10.0.0.0/8",
                    "consumerSessionTimeoutMs": 30000, "memoryBudgetBytes": 536870912,
                    "env": {"GATEWAY_MAX_BODY_BYTES": "2097152", "GATEWAY_PRODUCER_IDEMPOTENT": True}},
        "extraEnv": [{"name": "TEAM_A_KAFKA_PASSWORD",
                      "valueFrom": {"secretKeyRef": {"name": "team-a-kafka", "key": "password"}}}],
        "terminationGracePeriodSeconds": 45,
        "preStopSleepSeconds": 3,
    },
    "existing-secrets": {
        "kafka": {"bootstrap": BOOTSTRAP, "securityProtocol": "SASL_PLAINTEXT",
                  "sasl": {"username": "gateway", "existingSecret": "kafka-sasl", "existingSecretKey": "password"}},
        "tenants": {"existingSecret": "gateway-tenants", "key": "tenants.yml"},
        "auth": {"existingSecret": "gateway-tokens"},
        "serviceMonitor": {"enabled": True},
    },
    "peer-tls": {  # HTTPS between replicas, no generated tokens, chart limits
        "kafka": {"bootstrap": BOOTSTRAP},
        "tls": {"enabled": True, "secretName": "gateway-tls"},
        "auth": {"generateTokens": False, "peerToken": "peer-token-from-values", "adminToken": "admin-from-values"},
        "serviceMonitor": {"enabled": True},
        "networkPolicy": {"ingressFrom": [{"namespaceSelector": {"matchLabels": {"team": "edge"}}},
                                          {"ipBlock": {"cidr": "10.20.0.0/16"}}],
                          "metricsFrom": []},
        "gateway": {"deniedTopics": "audit-*,re:^secret\\..*", "http": {"maxHeaderBytes": 32768,
                                                                   "maxConnections": 2000}},
    },
    "deployment-hpa": {  # durable instances make a Deployment with an HPA safe
        "kafka": {"bootstrap": BOOTSTRAP},
        "workload": "Deployment",
        "autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 20, "targetCPUUtilizationPercentage": 65},
    },
    "single-replica": {
        "kafka": {"bootstrap": "kafka:9092"},
        "replicaCount": 1,
        "podDisruptionBudget": {"enabled": False},
        "readinessProbe": None,
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["streaming"]}]}]}}},
    },
}
# gateway.forwardedAllowIps has no default: the chart asks for the ingress controller's network
INGRESS_CIDR = "10.244.0.0/16"
for _values in VALUE_SETS.values():
    _values.setdefault("gateway", {}).setdefault("forwardedAllowIps", INGRESS_CIDR)
# Secrets the value sets name but do not create (they exist in the cluster), with their keys.
EXTERNAL_SECRETS = {"kafka-client-tls": {"ca.crt", "tls.crt", "tls.key"}, "team-a-kafka": {"password"},
                    "kafka-sasl": {"password"}, "gateway-tenants": {"tenants.yml"},
                    "gateway-tokens": {"admin-token", "peer-token"}, "gateway-tls": {"tls.crt", "tls.key", "ca.crt"}}


# --- rendering -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def chart() -> Any:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


class Rendered:
    def __init__(self, values: dict[str, Any], manifests: dict[str, str], merged: dict[str, Any]) -> None:
        self.values = merged
        self.notes = next((text for path, text in manifests.items() if path.endswith("NOTES.txt")), "")
        self.objects: list[dict[str, Any]] = []
        for path, text in sorted(manifests.items()):
            if path.endswith(".txt"):
                continue
            for doc in yaml.safe_load_all(text):
                if doc is not None:
                    doc["__template__"] = path
                    self.objects.append(doc)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        found = [o for o in self.of(kind) if name is None or o["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
        return found[0]

    @property
    def workload(self) -> dict[str, Any]:
        """The StatefulSet or the Deployment (values: workload): exactly one of them is rendered."""
        found = [o for o in self.objects if o["kind"] in WORKLOADS]
        assert len(found) == 1, [o["kind"] for o in found]
        return found[0]

    @property
    def pod(self) -> dict[str, Any]:
        return self.workload["spec"]["template"]["spec"]

    @property
    def container(self) -> dict[str, Any]:
        (c,) = [c for c in self.pod["containers"] if c["name"] == "gateway"]
        return c

    def secret_data(self, name: str) -> dict[str, str] | None:
        for s in self.of("Secret"):
            if s["metadata"]["name"] == name:
                return {k: base64.b64decode(v).decode() for k, v in s.get("data", {}).items()}
        return None

    def env(self) -> dict[str, Any]:
        """The container's environment as the kubelet builds it: envFrom first, env entries win."""
        out: dict[str, Any] = {}
        for source in self.container.get("envFrom", []):
            if "configMapRef" in source:
                out.update(self.one("ConfigMap", source["configMapRef"]["name"])["data"])
        for entry in self.container.get("env", []):
            out[entry["name"]] = entry["value"] if "value" in entry else entry["valueFrom"]
        return out

    def headless(self) -> dict[str, Any]:
        (svc,) = [s for s in self.of("Service") if s["spec"].get("clusterIP") == "None"]
        if self.workload["kind"] == "StatefulSet":
            assert self.workload["spec"]["serviceName"] == svc["metadata"]["name"]
        return svc


def render(chart: Any, values: dict[str, Any]) -> Rendered:
    values = copy.deepcopy(values)
    values.setdefault("gateway", {}).setdefault("forwardedAllowIps", INGRESS_CIDR)
    manifests = chart.render(copy.deepcopy(values), name=RELEASE, namespace=NAMESPACE, is_install=True)
    return Rendered(values, manifests, chart.merge_values(copy.deepcopy(values)))


@pytest.fixture(scope="module", params=sorted(VALUE_SETS))
def rendered(request: pytest.FixtureRequest, chart: Any) -> Rendered:
    return render(chart, VALUE_SETS[request.param])


# --- lint ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_lint_is_clean(name: str) -> None:
    report = helm.lint(CHART, copy.deepcopy(VALUE_SETS[name]), strict=True, namespace=NAMESPACE,
                       kube_version="v1.30.0")
    problems = [m for m in report["messages"] if m["severity"] >= 2]  # 1 = info ("icon is recommended")
    assert not report["errors"] and not problems, report


def test_lint_fails_without_a_bootstrap() -> None:
    """The chart's own defaults are not deployable: kafka.bootstrap has no default."""
    report = helm.lint(CHART, None, strict=True, namespace=NAMESPACE)
    assert report["errors"] and any("/kafka/bootstrap" in e for e in report["errors"]), report


def test_yaml_files_pass_yamllint() -> None:
    rules = "extends: default\nrules:\n  document-start: disable\n  comments: {min-spaces-from-content: 1}\n"
    # the rule file is a copy of dashboards/alerts.yaml (long PromQL and descriptions): no line length there
    for path, line_length in ((CHART / "Chart.yaml", "{max: 120}"), (CHART / "values.yaml", "{max: 120}"),
                              (CHART_ALERTS, "disable")):
        config = YamlLintConfig(f"{rules}  line-length: {line_length}\n")
        problems = list(linter.run(path.read_text(), config, str(path)))
        assert not problems, f"{path.relative_to(ROOT)}: " + "; ".join(f"{p.line}: {p.message}" for p in problems)


# --- schemas ---------------------------------------------------------------------------------------

DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?"
                                         r"(([0-9]+)s)?(([0-9]+)ms)?)$"}
STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
SECRET_KEY_SELECTOR = {"type": "object", "required": ["key"], "additionalProperties": False,
                       "properties": {"name": {"type": "string"}, "key": {"type": "string"},
                                      "optional": {"type": "boolean"}}}
RELABEL = {"type": "object", "additionalProperties": False, "properties": {
    "action": {"type": "string"}, "sourceLabels": {"type": "array", "items": {"type": "string"}},
    "separator": {"type": "string"}, "targetLabel": {"type": "string"}, "regex": {"type": "string"},
    "modulus": {"type": "integer"}, "replacement": {"type": "string"}}}
METADATA = {"type": "object", "required": ["name", "namespace"], "properties": {
    "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", "maxLength": 253},
    "namespace": {"type": "string"}, "labels": STR_MAP, "annotations": STR_MAP}}
# Subsets of the Prometheus Operator's CRD schemas (monitoring.coreos.com/v1): the fields the chart uses.
CRD_SCHEMAS: dict[str, dict[str, Any]] = {
    "ServiceMonitor": {
        "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "ServiceMonitor"},
            "metadata": METADATA,
            "spec": {"type": "object", "required": ["selector", "endpoints"], "additionalProperties": False,
                     "properties": {
                         "jobLabel": {"type": "string"},
                         "podTargetLabels": {"type": "array", "items": {"type": "string"}},
                         "targetLabels": {"type": "array", "items": {"type": "string"}},
                         "namespaceSelector": {"type": "object", "additionalProperties": False, "properties": {
                             "any": {"type": "boolean"},
                             "matchNames": {"type": "array", "items": {"type": "string"}}}},
                         "selector": {"type": "object", "additionalProperties": False, "properties": {
                             "matchLabels": STR_MAP, "matchExpressions": {"type": "array"}}},
                         "endpoints": {"type": "array", "minItems": 1, "items": {
                             "type": "object", "additionalProperties": False, "properties": {
                                 "port": {"type": "string"}, "path": {"type": "string", "pattern": "^/"},
                                 "scheme": {"enum": ["http", "https"]}, "interval": DURATION,
                                 "tlsConfig": {"type": "object", "additionalProperties": False, "properties": {
                                     "serverName": {"type": "string"}, "ca": {
                                         "type": "object", "additionalProperties": False,
                                         "properties": {"secret": SECRET_KEY_SELECTOR}}}},
                                 "scrapeTimeout": DURATION, "honorLabels": {"type": "boolean"},
                                 "bearerTokenSecret": SECRET_KEY_SELECTOR,
                                 "authorization": {"type": "object", "additionalProperties": False, "properties": {
                                     "type": {"type": "string"}, "credentials": SECRET_KEY_SELECTOR}},
                                 "relabelings": {"type": "array", "items": RELABEL},
                                 "metricRelabelings": {"type": "array", "items": RELABEL}}}}}}}},
    "PrometheusRule": {
        "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "PrometheusRule"},
            "metadata": METADATA,
            "spec": {"type": "object", "required": ["groups"], "additionalProperties": False, "properties": {
                "groups": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/group"}}}}},
        "$defs": {
            "group": {"type": "object", "required": ["name", "rules"], "additionalProperties": False, "properties": {
                "name": {"type": "string", "minLength": 1}, "interval": DURATION,
                "limit": {"type": "integer"}, "labels": STR_MAP,
                "rules": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/rule"}}}},
            "rule": {"type": "object", "required": ["expr"], "additionalProperties": False,
                     "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                     "properties": {
                         "alert": {"type": "string", "pattern": "^[a-zA-Z_:][a-zA-Z0-9_:]*$"},
                         "record": {"type": "string", "pattern": "^[a-zA-Z_:][a-zA-Z0-9_:]*$"},
                         "expr": {"type": ["string", "integer"], "minLength": 1},
                         "for": DURATION, "keep_firing_for": DURATION,
                         "labels": STR_MAP, "annotations": STR_MAP}}},
    },
}


def validate_object(obj: dict[str, Any], version: str) -> None:
    obj = {k: v for k, v in obj.items() if k != "__template__"}
    if obj["kind"] in CRD_SCHEMAS:
        jsonschema.Draft202012Validator(CRD_SCHEMAS[obj["kind"]]).validate(obj)
    else:
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_object_validates_strictly(rendered: Rendered, version: str) -> None:
    assert rendered.objects
    for obj in rendered.objects:
        try:
            validate_object(obj, version)
        except (jsonschema.ValidationError, kubernetes_validate.ValidationError) as e:
            pytest.fail(f"{obj['__template__']} {obj['kind']}/{obj['metadata']['name']} (Kubernetes {version}): "
                        f"{e.message} at {'.'.join(map(str, e.absolute_path))}")


def test_strict_validation_can_fail(chart: Any) -> None:
    """A typo in a pod spec (an unknown field) and a CRD field of the wrong type are caught."""
    r = render(chart, VALUE_SETS["monitoring"])
    sts = copy.deepcopy(r.workload)
    sts["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {"path": "/readyz", "port": 1}}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_object(sts, K8S_VERSIONS[-1])
    monitor = copy.deepcopy(r.one("ServiceMonitor"))
    monitor["spec"]["endpoints"][0]["interval"] = 30
    with pytest.raises(jsonschema.ValidationError):
        validate_object(monitor, K8S_VERSIONS[-1])


# --- what every value set must guarantee ---------------------------------------------------------------

def test_objects_are_namespaced_and_labelled(rendered: Rendered) -> None:
    for obj in rendered.objects:
        meta = obj["metadata"]
        assert meta["namespace"] == NAMESPACE, obj["kind"]
        assert meta["labels"]["app.kubernetes.io/instance"] == RELEASE
        assert meta["labels"]["app.kubernetes.io/name"] == "kafka-consumer-gateway"


def test_workload_and_replica_ids(rendered: Rendered) -> None:
    """A StatefulSet: the pod name is the replica id (stable across restarts); a Deployment: the pod's UID
    (unique, stable for the pod's life; its name can exceed 40 characters), with durable instances."""
    w = rendered.workload
    kind = rendered.values["workload"]
    assert w["kind"] == kind and not [o for o in rendered.objects if o["kind"] in WORKLOADS and o is not w]
    env = rendered.env()
    assert env["GATEWAY_STATIC_MEMBERSHIP"] == "true"
    autoscaling = rendered.values["autoscaling"]
    if kind == "StatefulSet":
        assert w["spec"]["podManagementPolicy"] == "Parallel"
        assert w["spec"]["updateStrategy"]["type"] == "RollingUpdate"
        assert env["GATEWAY_REPLICA_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}
        most = autoscaling["maxReplicas"] if autoscaling["enabled"] else w["spec"]["replicas"]
        assert REPLICA_ID.fullmatch(f"{w['metadata']['name']}-{most - 1}"), "pod names must be valid replica ids"
    else:
        assert "serviceName" not in w["spec"] and "podManagementPolicy" not in w["spec"]
        # surge: the new pod is ready before an old one stops and hands its instances off
        assert w["spec"]["strategy"] == {"type": "RollingUpdate",
                                         "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
        assert env["GATEWAY_REPLICA_ID"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
        assert REPLICA_ID.fullmatch(str(uuid.uuid4())), "a pod UID must be a valid replica id"
        assert env["GATEWAY_DURABLE_INSTANCES"] == "true"
    selector = w["spec"]["selector"]["matchLabels"]
    assert selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
    for svc in rendered.of("Service"):
        assert svc["spec"]["selector"] == selector


def test_peer_discovery_uses_the_headless_service(rendered: Rendered) -> None:
    headless = rendered.headless()
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    port = rendered.container["ports"][0]["containerPort"]
    name = headless["metadata"]["name"]
    assert rendered.env()["GATEWAY_PEER_DNS"] == f"{name}.{NAMESPACE}.svc.cluster.local:{port}"
    assert [p["port"] for p in headless["spec"]["ports"]] == [port]
    clients = [s for s in rendered.of("Service") if s["metadata"]["name"] != name]
    assert len(clients) == 1 and clients[0]["spec"].get("clusterIP") != "None"


def test_kafka_is_external_and_the_server_listens_on_all_interfaces(rendered: Rendered) -> None:
    env = rendered.env()
    assert env["GATEWAY_KAFKA_BOOTSTRAP"] == rendered.values["kafka"]["bootstrap"]
    assert env["GATEWAY_HOST"] == "0.0.0.0"
    assert env["GATEWAY_PORT"] == str(rendered.container["ports"][0]["containerPort"])


def test_probes(rendered: Rendered) -> None:
    c = rendered.container
    assert c["ports"][0]["name"] == "http"
    scheme = {"scheme": "HTTPS"} if rendered.values["tls"]["enabled"] else {}  # the listener serves HTTPS only
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http", **scheme}
    assert c["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http", **scheme}
    if rendered.values.get("readinessProbe") is None:  # null removes a default
        assert "readinessProbe" not in c
    else:
        assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http", **scheme}
        # /readyz waits up to 5 s for a tenant's metadata
        assert c["readinessProbe"]["timeoutSeconds"] > 5


def test_security_context(rendered: Rendered) -> None:
    pod, c = rendered.pod, rendered.container
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001  # the image's USER
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}  # Pod Security "restricted"
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert pod["automountServiceAccountToken"] is False
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]], "the only writable path, /tmp, is an emptyDir"
    assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]


def test_termination_grace_covers_drain_and_shutdown(rendered: Rendered) -> None:
    env, c = rendered.env(), rendered.container
    sleep = 0
    if "lifecycle" in c:
        cmd = c["lifecycle"]["preStop"]["exec"]["command"]
        assert cmd[0] == "sleep"
        sleep = int(cmd[1])
    budget = sleep + float(env["GATEWAY_SHUTDOWN_DRAIN_S"]) + float(env["GATEWAY_SHUTDOWN_TIMEOUT_S"])
    assert rendered.pod["terminationGracePeriodSeconds"] > budget


def test_secret_references_resolve(rendered: Rendered) -> None:
    """Every Secret/ConfigMap the pod reads is rendered with that key, or is a declared external one."""

    def keys_of(name: str) -> set[str]:
        data = rendered.secret_data(name)
        if data is not None:
            return set(data)
        assert name in EXTERNAL_SECRETS, f"Secret {name} is neither rendered nor an expected external Secret"
        return EXTERNAL_SECRETS[name]

    for entry in rendered.container["env"]:
        ref = entry.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            assert ref["key"] in keys_of(ref["name"]), entry
    for volume in rendered.pod["volumes"]:
        if "secret" in volume:
            assert keys_of(volume["secret"]["secretName"])
    env = rendered.env()
    for var in ("GATEWAY_ADMIN_TOKEN", "GATEWAY_PEER_TOKEN"):
        assert "secretKeyRef" in env[var], f"{var} must come from a Secret"
    configmaps = {c["metadata"]["name"] for c in rendered.of("ConfigMap")}
    assert {s["configMapRef"]["name"] for s in rendered.container["envFrom"] if "configMapRef" in s} <= configmaps
    for cm in rendered.of("ConfigMap"):
        assert not any(k.endswith(("_PASSWORD", "_TOKEN")) for k in cm["data"]), "secrets belong in Secrets"


def test_rollout_on_configuration_change(chart: Any, rendered: Rendered) -> None:
    annotations = rendered.workload["spec"]["template"]["metadata"]["annotations"]
    assert re.fullmatch(r"[0-9a-f]{64}", annotations["checksum/config"])
    changed = copy.deepcopy(VALUE_SETS["defaults"])
    changed["gateway"] = {"logLevel": "DEBUG"}
    base = render(chart, VALUE_SETS["defaults"]).workload["spec"]["template"]["metadata"]["annotations"]
    assert render(chart, changed).workload["spec"]["template"]["metadata"]["annotations"]["checksum/config"] \
        != base["checksum/config"]


# --- value-set specifics -------------------------------------------------------------------------------

def test_defaults(chart: Any) -> None:
    r = render(chart, VALUE_SETS["defaults"])
    assert r.workload["kind"] == "StatefulSet" and r.workload["spec"]["replicas"] == 3
    # durable instances on by default, their descriptors in the gateway's default topic
    assert r.env()["GATEWAY_DURABLE_INSTANCES"] == "true"
    assert r.env()["GATEWAY_INSTANCES_TOPIC"] == "__kcg_instances"
    assert not r.of("HorizontalPodAutoscaler") and not r.of("ServiceMonitor") and not r.of("PrometheusRule")
    assert r.one("PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    tokens = r.secret_data(r.workload["metadata"]["name"])
    assert tokens is not None and len(tokens["admin-token"]) == 48 and len(tokens["peer-token"]) == 48
    assert tokens["admin-token"] != tokens["peer-token"]
    assert "GATEWAY_TENANTS_FILE" not in r.env()
    assert "WITHOUT AUTHENTICATION" in r.notes
    assert r.one("ServiceAccount")["automountServiceAccountToken"] is False
    affinity = r.pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert affinity[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"


def test_hpa_and_pdb(chart: Any) -> None:
    r = render(chart, VALUE_SETS["hpa-pdb"])
    hpa = r.one("HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet",
                                             "name": r.workload["metadata"]["name"]}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 12)
    assert {m["resource"]["name"] for m in hpa["spec"]["metrics"]} == {"cpu", "memory"}
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] >= 300
    assert "replicas" not in r.workload["spec"], "the HPA owns the replica count"
    pdb = r.one("PodDisruptionBudget")["spec"]
    assert pdb["minAvailable"] == "50%" and "maxUnavailable" not in pdb
    assert pdb["selector"]["matchLabels"] == r.workload["spec"]["selector"]["matchLabels"]


@pytest.mark.parametrize("workload", WORKLOADS)
def test_hpa_targets_the_rendered_workload(chart: Any, workload: str) -> None:
    """Either workload with an HPA: the HPA scales the one that is rendered, which leaves the replica count to
    it; peers are found through the headless Service's per-pod records either way; durable instances on."""
    values = {"kafka": {"bootstrap": BOOTSTRAP}, "workload": workload,
              "autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 8}}
    r = render(chart, values)
    w = r.workload
    assert w["kind"] == workload
    hpa = r.one("HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": workload, "name": w["metadata"]["name"]}
    assert "replicas" not in w["spec"], "the HPA owns the replica count"
    env = r.env()
    headless = r.headless()
    assert env["GATEWAY_PEER_DNS"] == f"{headless['metadata']['name']}.{NAMESPACE}.svc.cluster.local:8080"
    assert headless["spec"]["selector"] == w["spec"]["selector"]["matchLabels"]
    assert "GATEWAY_PEERS" not in env
    assert env["GATEWAY_DURABLE_INSTANCES"] == "true"
    field = {"StatefulSet": "metadata.name", "Deployment": "metadata.uid"}[workload]
    assert env["GATEWAY_REPLICA_ID"] == {"fieldRef": {"fieldPath": field}}
    assert f"rollout restart {workload.lower()}/{w['metadata']['name']}" in r.notes
    assert r.one("PodDisruptionBudget")["spec"]["selector"]["matchLabels"] == w["spec"]["selector"]["matchLabels"]
    for version in K8S_VERSIONS:
        validate_object(w, version)
        validate_object(hpa, version)


def test_durable_instances_can_be_turned_off_with_a_statefulset(chart: Any) -> None:
    values = {"kafka": {"bootstrap": BOOTSTRAP}, "gateway": {"durableInstances": False, "instancesTopic": "x"}}
    r = render(chart, values)
    assert r.workload["kind"] == "StatefulSet"
    assert r.env()["GATEWAY_DURABLE_INSTANCES"] == "false" and "GATEWAY_INSTANCES_TOPIC" not in r.env()
    assert "Static group membership is on" in r.notes
    values["gateway"] = {"instancesTopic": "team.kcg-instances"}
    assert render(chart, values).env()["GATEWAY_INSTANCES_TOPIC"] == "team.kcg-instances"


@pytest.mark.parametrize(("name", "field"), [("monitoring", "authorization"),
                                             ("monitoring-legacy-operator", "bearerTokenSecret"),
                                             ("existing-secrets", "authorization")])
def test_service_monitor_scrapes_with_the_admin_token(chart: Any, name: str, field: str) -> None:
    r = render(chart, VALUE_SETS[name])
    monitor = r.one("ServiceMonitor")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    ref = endpoint[field]["credentials"] if field == "authorization" else endpoint[field]
    if field == "authorization":
        assert endpoint["authorization"]["type"] == "Bearer"
    admin = r.container["env"][[e["name"] for e in r.container["env"]].index("GATEWAY_ADMIN_TOKEN")]
    assert ref == admin["valueFrom"]["secretKeyRef"], "the scrape must send the gateway's admin token"
    # it selects the clients' Service only (one target per pod), through a port it has
    selected = [s for s in r.of("Service")
                if monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()]
    assert [s["metadata"]["name"] for s in selected] == [r.workload["metadata"]["name"]]
    assert endpoint["port"] in {p["name"] for p in selected[0]["spec"]["ports"]}
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE]
    # dashboards/alerts.yaml expects job="kafka-consumer-gateway": the job label comes from this Service label
    assert selected[0]["metadata"]["labels"][monitor["spec"]["jobLabel"]] == "kafka-consumer-gateway"
    if name == "monitoring":
        assert monitor["metadata"]["labels"]["release"] == "prometheus"


def test_prometheus_rule_embeds_the_alert_file(chart: Any) -> None:
    r = render(chart, VALUE_SETS["monitoring"])
    groups = r.one("PrometheusRule")["spec"]["groups"]
    file_groups = yaml.safe_load(CHART_ALERTS.read_text())["groups"]
    assert groups == file_groups + VALUE_SETS["monitoring"]["prometheusRule"]["extraGroups"]


def test_tenants_sasl_tls(chart: Any) -> None:
    values = VALUE_SETS["tenants-sasl-tls"]
    r = render(chart, values)
    env, c, name = r.env(), r.container, r.workload["metadata"]["name"]
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in r.pod["volumes"]}
    # the tenants file: a Secret, mounted read-only, named by GATEWAY_TENANTS_FILE
    tenants_dir = mounts["tenants"]["mountPath"]
    assert mounts["tenants"]["readOnly"] is True
    assert env["GATEWAY_TENANTS_FILE"] == f"{tenants_dir}/tenants.yaml"
    tenants = r.secret_data(volumes["tenants"]["secret"]["secretName"])
    assert tenants == {"tenants.yaml": values["tenants"]["file"]}
    # SASL over TLS with a client certificate
    assert env["GATEWAY_SECURITY_PROTOCOL"] == "SASL_SSL"
    assert env["GATEWAY_SASL_MECHANISM"] == "SCRAM-SHA-512" and env["GATEWAY_SASL_USERNAME"] == "gateway"
    secret = r.secret_data(name)
    assert secret is not None
    assert secret[env["GATEWAY_SASL_PASSWORD"]["secretKeyRef"]["key"]] == "s3cr3t-sasl"
    assert secret[env["GATEWAY_SSL_KEY_PASSWORD"]["secretKeyRef"]["key"]] == "key-pass"
    assert secret["admin-token"] == "admin-token-from-values" and secret["peer-token"] == "peer-token-from-values"
    tls_dir = mounts["kafka-tls"]["mountPath"]
    assert volumes["kafka-tls"]["secret"]["secretName"] == "kafka-client-tls"
    assert (env["GATEWAY_SSL_CAFILE"], env["GATEWAY_SSL_CERTFILE"], env["GATEWAY_SSL_KEYFILE"]) == (
        f"{tls_dir}/ca.crt", f"{tls_dir}/tls.crt", f"{tls_dir}/tls.key")
    # other settings
    assert env["GATEWAY_PUBLIC_URL"] == "https://kafka-gw.example.com"
    assert env["GATEWAY_CONSUMER_SESSION_TIMEOUT_MS"] == "30000"
    assert env["GATEWAY_MEMORY_BUDGET_BYTES"] == "536870912"
    assert env["GATEWAY_MAX_BODY_BYTES"] == "2097152" and env["GATEWAY_PRODUCER_IDEMPOTENT"] == "true"
    assert env["TEAM_A_KAFKA_PASSWORD"] == {"secretKeyRef": {"name": "team-a-kafka", "key": "password"}}
    assert c["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "3"]
    assert r.pod["terminationGracePeriodSeconds"] == 45
    assert "WITHOUT AUTHENTICATION" not in r.notes


def test_existing_secrets_are_used_and_not_rendered(chart: Any) -> None:
    r = render(chart, VALUE_SETS["existing-secrets"])
    assert not r.of("Secret"), "everything secret comes from the cluster's own Secrets"
    env = r.env()
    assert env["GATEWAY_ADMIN_TOKEN"]["secretKeyRef"] == {"name": "gateway-tokens", "key": "admin-token"}
    assert env["GATEWAY_PEER_TOKEN"]["secretKeyRef"] == {"name": "gateway-tokens", "key": "peer-token"}
    assert env["GATEWAY_SASL_PASSWORD"]["secretKeyRef"] == {"name": "kafka-sasl", "key": "password"}
    assert env["GATEWAY_TENANTS_FILE"].endswith("/tenants.yml")
    volumes = {v["name"]: v for v in r.pod["volumes"]}
    assert volumes["tenants"]["secret"]["secretName"] == "gateway-tenants"
    assert "GATEWAY_SSL_CAFILE" not in env


def test_single_replica(chart: Any) -> None:
    r = render(chart, VALUE_SETS["single-replica"])
    assert r.workload["spec"]["replicas"] == 1
    assert not r.of("PodDisruptionBudget")
    assert "one replica" in r.notes
    assert list(r.pod["affinity"]) == ["nodeAffinity"], "an explicit affinity replaces the default"


def test_long_release_names_still_give_valid_replica_ids(chart: Any) -> None:
    values = copy.deepcopy(VALUE_SETS["defaults"])
    values["replicaCount"] = 999
    manifests = chart.render(values, name="a-very-long-release-name-for-the-gateway", namespace=NAMESPACE)
    sts = next(d for path, text in manifests.items() if path.endswith("workload.yaml")
               for d in yaml.safe_load_all(text) if d)
    assert sts["kind"] == "StatefulSet"
    assert REPLICA_ID.fullmatch(f"{sts['metadata']['name']}-998")


# --- values the chart refuses ----------------------------------------------------------------------------

BAD_SCHEMA = {
    "no bootstrap (no embedded broker on Kubernetes)": {},
    "empty bootstrap": {"kafka": {"bootstrap": ""}},
    "bootstrap without a port": {"kafka": {"bootstrap": "kafka.svc"}},
    "unknown security protocol": {"kafka": {"bootstrap": "k:9092", "securityProtocol": "TLS"}},
    "unknown routing": {"kafka": {"bootstrap": "k:9092"}, "gateway": {"routing": "proxy"}},
    "unknown workload": {"kafka": {"bootstrap": "k:9092"}, "workload": "DaemonSet"},
    "durable instances through gateway.env": {"kafka": {"bootstrap": "k:9092"},
                                              "gateway": {"env": {"GATEWAY_DURABLE_INSTANCES": "false"}}},
    "bad instances topic": {"kafka": {"bootstrap": "k:9092"}, "gateway": {"instancesTopic": "a topic"}},
    "misspelt top-level value": {"kafka": {"bootstrap": "k:9092"}, "replicas": 3},
    "zero replicas": {"kafka": {"bootstrap": "k:9092"}, "replicaCount": 0},
    "chart-managed variable in gateway.env": {"kafka": {"bootstrap": "k:9092"},
                                              "gateway": {"env": {"GATEWAY_REPLICA_ID": "x"}}},
    "non-GATEWAY variable in gateway.env": {"kafka": {"bootstrap": "k:9092"}, "gateway": {"env": {"PATH": "/"}}},
    "full name too long for replica ids": {"kafka": {"bootstrap": "k:9092"}, "fullnameOverride": "x" * 37},
    "bad scrape interval": {"kafka": {"bootstrap": "k:9092"}, "serviceMonitor": {"enabled": True, "interval": 30}},
}
BAD_TEMPLATE = {
    "grace period shorter than drain + shutdown": (
        {"kafka": {"bootstrap": "k:9092"}, "terminationGracePeriodSeconds": 11}, "terminationGracePeriodSeconds"),
    "SASL without a password": (
        {"kafka": {"bootstrap": "k:9092", "securityProtocol": "SASL_SSL", "sasl": {"username": "u"}}},
        "kafka.sasl.password"),
    "tenants file given twice": (
        {"kafka": {"bootstrap": "k:9092"}, "tenants": {"file": "version: 1", "existingSecret": "t"}},
        "tenants.file or tenants.existingSecret"),
    "no tokens and no generation": (
        {"kafka": {"bootstrap": "k:9092"}, "auth": {"generateTokens": False}}, "auth.peerToken"),
    "a Deployment without durable instances": (
        {"kafka": {"bootstrap": "k:9092"}, "workload": "Deployment", "gateway": {"durableInstances": False}},
        "workload: Deployment needs gateway.durableInstances"),
    "both PDB bounds": (
        {"kafka": {"bootstrap": "k:9092"}, "podDisruptionBudget": {"maxUnavailable": 1, "minAvailable": 1}},
        "podDisruptionBudget"),
}


for _values, _ in BAD_TEMPLATE.values():
    _values.setdefault("gateway", {}).setdefault("forwardedAllowIps", INGRESS_CIDR)


def test_trusted_proxies_must_be_given(chart: Any) -> None:
    """No default trusted proxy (127.0.0.1 made every client behind an ingress one address): the chart
    asks for the ingress controller's network, or "none"."""
    values = {"kafka": {"bootstrap": BOOTSTRAP}}
    chart.validate_schema(copy.deepcopy(values))
    with pytest.raises(helm.HelmRenderError, match=re.escape("gateway.forwardedAllowIps is required")):
        chart.render(copy.deepcopy(values), name=RELEASE, namespace=NAMESPACE)
    assert render(chart, values).env()["GATEWAY_FORWARDED_ALLOW_IPS"] == INGRESS_CIDR
    values["gateway"] = {"forwardedAllowIps": "none"}
    assert render(chart, values).env()["GATEWAY_FORWARDED_ALLOW_IPS"] == ""
    with pytest.raises(helm.HelmValuesError):
        chart.validate_schema({"kafka": {"bootstrap": BOOTSTRAP}, "gateway": {"forwardedAllowIps": "$(evil)"}})


@pytest.mark.parametrize("name", sorted(BAD_SCHEMA))
def test_values_schema_rejects(chart: Any, name: str) -> None:
    with pytest.raises(helm.HelmValuesError):
        chart.validate_schema(copy.deepcopy(BAD_SCHEMA[name]))
    with pytest.raises(helm.HelmValuesError):
        chart.render(copy.deepcopy(BAD_SCHEMA[name]), name=RELEASE, namespace=NAMESPACE)


@pytest.mark.parametrize("name", sorted(BAD_TEMPLATE))
def test_template_checks_reject(chart: Any, name: str) -> None:
    values, message = BAD_TEMPLATE[name]
    chart.validate_schema(copy.deepcopy(values))  # schema-valid: the templates catch these
    with pytest.raises(helm.HelmRenderError, match=re.escape(message)):
        chart.render(copy.deepcopy(values), name=RELEASE, namespace=NAMESPACE)


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_good_value_sets_pass_the_schema(chart: Any, name: str) -> None:
    chart.validate_schema(copy.deepcopy(VALUE_SETS[name]))


# --- alert rules -----------------------------------------------------------------------------------------

def test_chart_alert_rules_are_a_valid_rule_file() -> None:
    rules = yaml.safe_load(CHART_ALERTS.read_text())
    assert set(rules) == {"groups"}
    validator = jsonschema.Draft202012Validator({"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/group"},
                                                 "$defs": CRD_SCHEMAS["PrometheusRule"]["$defs"]})
    validator.validate(rules["groups"])
    names = [g["name"] for g in rules["groups"]]
    assert len(names) == len(set(names)), "rule group names must be unique"


def test_chart_alert_rules_are_the_repository_rules() -> None:
    """Helm reads nothing outside the chart: files/alerts.yaml is a copy of dashboards/alerts.yaml.
    After editing dashboards/alerts.yaml: cp dashboards/alerts.yaml helm/kafka-consumer-gateway/files/"""
    if REPO_ALERTS.exists():
        assert CHART_ALERTS.read_bytes() == REPO_ALERTS.read_bytes(), (
            "helm/kafka-consumer-gateway/files/alerts.yaml differs from dashboards/alerts.yaml: copy it over")
    else:  # until dashboards/alerts.yaml lands, the chart ships a marked placeholder
        assert "PLACEHOLDER" in CHART_ALERTS.read_text()
    if "job=" in CHART_ALERTS.read_text():  # the ServiceMonitor's jobLabel gives every target this job
        assert re.findall(r'job="([^"]+)"', CHART_ALERTS.read_text()) == \
            ["kafka-consumer-gateway"] * CHART_ALERTS.read_text().count('job="')


def test_allowed_hosts(chart: Any) -> None:
    """gateway.allowedHosts sets GATEWAY_ALLOWED_HOSTS; empty leaves the gateway's default."""
    values = {"kafka": {"bootstrap": BOOTSTRAP}, "gateway": {"allowedHosts": "kafka-gw.example.com,.corp.example"}}
    assert render(chart, values).env()["GATEWAY_ALLOWED_HOSTS"] == "kafka-gw.example.com,.corp.example"
    assert "GATEWAY_ALLOWED_HOSTS" not in render(chart, {"kafka": {"bootstrap": BOOTSTRAP}}).env()
