"""The Helm chart's hardening: a NetworkPolicy (ingress from the ingress controller, the replicas
and monitoring only), `auth.generateTokens: false` honoured (nothing generated; no peer token fails the
render), no checksum of a Secret in the pod template (it would publish a hash of the tokens), the HTTP limits
as values, and HTTPS between the replicas (certificates mounted, probes and scrapes over HTTPS).

The chart is rendered in-process as tests/deploy/test_helm.py does (its helpers are reused).
"""

from __future__ import annotations

import copy
import hashlib
import re
from typing import Any

import helm_python as helm
import pytest

from service.settings import Settings
from tests.deploy.test_helm import BOOTSTRAP, NAMESPACE, RELEASE, VALUE_SETS, render
from tests.deploy.test_helm import chart as chart  # the module-scoped chart fixture

BASE: dict[str, Any] = {"kafka": {"bootstrap": BOOTSTRAP}}


def values(**more: Any) -> dict[str, Any]:
    out = copy.deepcopy(BASE)
    for key, value in more.items():
        out[key] = value
    return out


def fails(chart: Any, vals: dict[str, Any], message: str) -> None:
    vals = copy.deepcopy(vals)
    vals.setdefault("gateway", {}).setdefault("forwardedAllowIps", "10.244.0.0/16")
    chart.validate_schema(copy.deepcopy(vals))  # schema-valid: the templates refuse it
    with pytest.raises(helm.HelmRenderError, match=re.escape(message)):
        chart.render(vals, name=RELEASE, namespace=NAMESPACE)


# --- (a) NetworkPolicy ---------------------------------------------------------------------------------

def test_network_policy_admits_only_the_ingress_controller_the_replicas_and_monitoring(chart: Any) -> None:
    r = render(chart, BASE)
    (policy,) = r.of("NetworkPolicy")
    spec = policy["spec"]
    selector = r.workload["spec"]["selector"]["matchLabels"]
    assert spec["podSelector"] == {"matchLabels": selector}
    assert spec["policyTypes"] == ["Ingress"], "egress stays open (Kafka anywhere, DNS)"
    port_name = r.container["ports"][0]["name"]
    for rule in spec["ingress"]:
        assert rule.get("from"), f"a rule without 'from' admits every source: {rule}"
        assert rule["ports"] == [{"port": port_name, "protocol": "TCP"}]
    sources = [rule["from"] for rule in spec["ingress"]]
    assert sources == [
        [{"podSelector": {"matchLabels": selector}}],  # the replicas (forwarding, /internal)
        [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}],
        [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
    ]
    # no rule admits a namespace or address range wholesale
    for source in (s for rule in sources for s in rule):
        assert source.get("namespaceSelector", {"matchLabels": {"x": "y"}}) != {}, source
        assert "ipBlock" not in source


def test_network_policy_is_overridable_and_can_be_turned_off(chart: Any) -> None:
    r = render(chart, VALUE_SETS["peer-tls"])
    sources = [rule["from"] for rule in r.one("NetworkPolicy")["spec"]["ingress"]]
    selector = r.workload["spec"]["selector"]["matchLabels"]
    assert sources == [[{"podSelector": {"matchLabels": selector}}],
                       [{"namespaceSelector": {"matchLabels": {"team": "edge"}}},
                        {"ipBlock": {"cidr": "10.20.0.0/16"}}]]
    assert not render(chart, values(networkPolicy={"enabled": False})).of("NetworkPolicy")
    extra = {"from": [{"podSelector": {"matchLabels": {"app": "sidecar-scraper"}}}], "ports": [{"port": 9102}]}
    r = render(chart, values(networkPolicy={"extraIngress": [extra]}))
    assert r.one("NetworkPolicy")["spec"]["ingress"][-1] == extra
    with pytest.raises(helm.HelmValuesError):
        chart.validate_schema(values(networkPolicy={"ingressFrom": [{}]}))  # an empty peer would admit all


# --- (b) generateTokens: false ------------------------------------------------------------------------

def test_generate_tokens_false_generates_nothing(chart: Any) -> None:
    vals = values(auth={"generateTokens": False, "peerToken": "the-peer-token-given"})
    first, second = render(chart, vals), render(chart, vals)
    name = first.workload["metadata"]["name"]
    assert first.secret_data(name) == {"peer-token": "the-peer-token-given"}
    assert second.secret_data(name) == first.secret_data(name), "nothing random in the render"
    env = first.env()
    assert env["GATEWAY_PEER_TOKEN"]["secretKeyRef"] == {"name": name, "key": "peer-token"}
    assert "GATEWAY_ADMIN_TOKEN" not in env, "no admin token given: none generated, none referenced"
    assert "No admin token" in first.notes
    both = render(chart, values(auth={"generateTokens": False, "peerToken": "p-given", "adminToken": "a-given"}))
    assert both.secret_data(name) == {"peer-token": "p-given", "admin-token": "a-given"}
    # the default still generates both, 48 random characters each
    generated = render(chart, BASE).secret_data(name)
    assert generated is not None and sorted(map(len, generated.values())) == [48, 48]


def test_generate_tokens_false_without_a_peer_token_fails_to_render(chart: Any) -> None:
    fails(chart, values(auth={"generateTokens": False}), "auth.peerToken")
    fails(chart, values(auth={"generateTokens": False, "adminToken": "a-given"}), "GATEWAY_PEER_TOKEN")
    fails(chart, values(auth={"generateTokens": False, "peerToken": "p"}, serviceMonitor={"enabled": True}),
          "auth.adminToken")
    # an existing Secret needs nothing generated
    r = render(chart, values(auth={"generateTokens": False, "existingSecret": "gateway-tokens"}))
    assert not r.of("Secret")
    assert r.env()["GATEWAY_PEER_TOKEN"]["secretKeyRef"]["name"] == "gateway-tokens"


# --- (c) no secret checksum ---------------------------------------------------------------------------

def test_no_checksum_of_a_secret_in_the_pod_template(chart: Any) -> None:
    one = values(auth={"adminToken": "admin-1", "peerToken": "peer-1"}, tenants={"file": "version: 1\ntenants: []\n"},
                 kafka={"bootstrap": BOOTSTRAP, "securityProtocol": "SASL_PLAINTEXT",
                        "sasl": {"username": "gw", "password": "sasl-1"}})
    two = copy.deepcopy(one)
    two["auth"] = {"adminToken": "admin-2", "peerToken": "peer-2"}
    two["tenants"]["file"] = "version: 1\ntenants: [] # other\n"
    two["kafka"]["sasl"]["password"] = "sasl-2"
    r1, r2 = render(chart, one), render(chart, two)
    assert r1.secret_data(r1.workload["metadata"]["name"]) != r2.secret_data(r2.workload["metadata"]["name"])
    assert r1.workload["spec"]["template"] == r2.workload["spec"]["template"], "secrets must leave no trace in the pods"
    annotations = r1.workload["spec"]["template"]["metadata"]["annotations"]
    assert set(annotations) == {"checksum/config"}
    secrets = [o for o in r1.objects if o["kind"] == "Secret"]
    assert secrets
    for value in annotations.values():  # in particular not a hash of any Secret's data
        for s in secrets:
            for v in s["data"].values():
                assert hashlib.sha256(v.encode()).hexdigest() != value
    # the ConfigMap still rolls the pods, and secretsRevision rolls them on purpose
    louder = copy.deepcopy(one)
    louder["gateway"] = {"logLevel": "DEBUG"}
    assert render(chart, louder).workload["spec"]["template"]["metadata"]["annotations"]["checksum/config"] != \
        annotations["checksum/config"]
    bumped = render(chart, {**one, "secretsRevision": "2026-11-25"})
    assert bumped.workload["spec"]["template"]["metadata"]["annotations"] == {
        **annotations, "kafka-consumer-gateway/secrets-revision": "2026-11-25"}
    assert "rollout restart" in r1.notes


# --- (d) limits as values -------------------------------------------------------------------------------

LIMITS = {  # chart value path -> (variable, Settings field)
    ("http", "maxHeaderBytes"): ("GATEWAY_HTTP_MAX_HEADER_BYTES", "http_max_header_bytes"),
    ("http", "maxHeaders"): ("GATEWAY_HTTP_MAX_HEADERS", "http_max_headers"),
    ("http", "headerTimeoutS"): ("GATEWAY_HTTP_HEADER_TIMEOUT_S", "http_header_timeout_s"),
    ("http", "maxConnections"): ("GATEWAY_HTTP_MAX_CONNECTIONS", "http_max_connections"),
    ("http", "keepAliveS"): ("GATEWAY_HTTP_KEEP_ALIVE_S", "http_keep_alive_s"),
    ("maxBatchInflatedBytes",): ("GATEWAY_MAX_BATCH_INFLATED_BYTES", "max_batch_inflated_bytes"),
    ("deniedTopicsDefaults",): ("GATEWAY_DENIED_TOPICS_DEFAULTS", "denied_topics_defaults"),
}


def test_limits_are_values_with_the_gateways_defaults(chart: Any) -> None:
    env = render(chart, BASE).env()
    for (variable, field) in LIMITS.values():
        default = Settings.model_fields[field].default
        assert Settings(**{field: env[variable]}).__getattribute__(field) == default, (variable, env[variable])
    assert "GATEWAY_DENIED_TOPICS" not in env  # the built-in internal topics only
    env = render(chart, VALUE_SETS["peer-tls"]).env()
    assert env["GATEWAY_HTTP_MAX_HEADER_BYTES"] == "32768" and env["GATEWAY_HTTP_MAX_CONNECTIONS"] == "2000"
    assert env["GATEWAY_DENIED_TOPICS"] == "audit-*,re:^secret\\..*"
    assert render(chart, values(gateway={"allowedHosts": "gw.example.com"})).env()["GATEWAY_ALLOWED_HOSTS"] == \
        "gw.example.com"


@pytest.mark.parametrize("bad", [{"http": {"maxHeaderBytes": 4096}}, {"http": {"maxHeaderBytes": 1 << 20}},
                                 {"http": {"maxConnections": -1}}, {"http": {"headerTimeoutS": 0}},
                                 {"http": {"maxHeadrs": 10}}, {"maxBatchInflatedBytes": 10},
                                 {"env": {"GATEWAY_HTTP_MAX_HEADERS": "5"}},
                                 {"env": {"GATEWAY_TLS_CERT_FILE": "/x"}}])
def test_the_schema_refuses_bad_limits(chart: Any, bad: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmValuesError):
        chart.validate_schema(values(gateway={"forwardedAllowIps": "none", **bad}))


# --- item 16 in the chart: HTTPS between the replicas -------------------------------------------------------

def test_tls_mounts_the_certificates_and_probes_over_https(chart: Any) -> None:
    r = render(chart, VALUE_SETS["peer-tls"])
    env, c = r.env(), r.container
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in r.pod["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "gateway-tls" and mounts["tls"]["readOnly"] is True
    tls_dir = mounts["tls"]["mountPath"]
    assert (env["GATEWAY_TLS_CERT_FILE"], env["GATEWAY_TLS_KEY_FILE"], env["GATEWAY_PEER_TLS_CA_FILE"]) == (
        f"{tls_dir}/tls.crt", f"{tls_dir}/tls.key", f"{tls_dir}/ca.crt")
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"]["scheme"] == "HTTPS", probe
    # peers are discovered by address and verify the headless Service's name (the gateway's default for
    # GATEWAY_PEER_DNS), which is also what the ServiceMonitor verifies
    assert "GATEWAY_PEER_TLS_SERVER_NAME" not in env
    peer_host = env["GATEWAY_PEER_DNS"].rsplit(":", 1)[0]
    assert peer_host == f"{r.headless()['metadata']['name']}.{NAMESPACE}.svc.cluster.local"
    (endpoint,) = r.one("ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"] == {"serverName": peer_host, "ca": {"secret": {"name": "gateway-tls",
                                                                                 "key": "ca.crt"}}}
    assert "https://" in r.notes
    # off by default: plain HTTP everywhere
    plain = render(chart, BASE)
    assert "GATEWAY_TLS_CERT_FILE" not in plain.env() and "scheme" not in plain.container["livenessProbe"]["httpGet"]
    fails(chart, values(tls={"enabled": True}), "tls.secretName")
