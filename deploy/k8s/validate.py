"""Offline checks of rendered fairway manifests (`kubectl kustomize deploy/k8s/overlays/X`).

Usage: python validate.py NAME=RENDERED.yaml [NAME=RENDERED.yaml ...]

- Every built-in object validates against the Kubernetes OpenAPI schemas (strict: unknown
  fields are errors) of each version in KUBERNETES_VERSIONS, with the `kubernetes-validate`
  package (schemas shipped in the package: no network, no cluster).
- Custom resources (ServiceMonitor, ScaledObject) get structural checks of the fields the
  operators require.
- References inside one overlay resolve: ConfigMaps mounted, Deployments scaled, pods
  selected by Services, PodDisruptionBudgets and the ServiceMonitor, probe ports.

Prints one JSON object on stdout: per overlay, the rendered fairway.toml and each worker
pool's terminationGracePeriodSeconds (tests/it/deploy.rs checks them against the
config's drain timeouts with fairway's own config parser). Exits 1 with every problem
listed on stderr.
"""

import json
import sys

import kubernetes_validate
import yaml

KUBERNETES_VERSIONS = ["1.29.0", "1.33.0"]
CUSTOM = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("keda.sh/v1alpha1", "ScaledObject"),
}


def labels_match(selector, labels):
    return all(labels.get(k) == v for k, v in (selector or {}).items())


def selector_match(selector, labels):
    if not labels_match(selector.get("matchLabels"), labels):
        return False
    for e in selector.get("matchExpressions", []):
        has = labels.get(e["key"])
        if e["operator"] == "In" and has not in e["values"]:
            return False
        if e["operator"] == "NotIn" and has in e["values"]:
            return False
        if e["operator"] == "Exists" and has is None:
            return False
    return True


def check_custom(doc, problems, where):
    spec = doc.get("spec") or {}
    if doc["kind"] == "ServiceMonitor":
        if not spec.get("selector") or not spec.get("endpoints"):
            problems.append(f"{where}: a ServiceMonitor needs spec.selector and spec.endpoints")
        for ep in spec.get("endpoints", []):
            if "port" not in ep and "targetPort" not in ep:
                problems.append(f"{where}: every endpoint names a port")
    if doc["kind"] == "ScaledObject":
        if not (spec.get("scaleTargetRef") or {}).get("name"):
            problems.append(f"{where}: spec.scaleTargetRef.name is required")
        for t in spec.get("triggers") or [None]:
            if not t or not t.get("type") or not isinstance(t.get("metadata"), dict):
                problems.append(f"{where}: every trigger needs a type and metadata")
                continue
            if t["type"] == "prometheus":
                missing = {"serverAddress", "query", "threshold"} - set(t["metadata"])
                if missing:
                    problems.append(f"{where}: prometheus trigger lacks {sorted(missing)}")
                if not all(isinstance(v, str) for v in t["metadata"].values()):
                    problems.append(f"{where}: KEDA trigger metadata values must be strings")
        lo, hi = spec.get("minReplicaCount", 0), spec.get("maxReplicaCount", 100)
        if not (isinstance(lo, int) and isinstance(hi, int) and 0 <= lo <= hi):
            problems.append(f"{where}: need 0 <= minReplicaCount <= maxReplicaCount")


def pod_templates(docs):
    for d in docs:
        if d["kind"] in ("Deployment", "Job"):
            yield d, d["spec"]["template"]


def check_references(docs, problems, name):
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], {})[d["metadata"]["name"]] = d
    configmaps = by_kind.get("ConfigMap", {})
    deployments = by_kind.get("Deployment", {})
    pods = [(d, t) for d, t in pod_templates(docs)]
    for d, t in pods:
        where = f"{name}: {d['kind']}/{d['metadata']['name']}"
        for v in t["spec"].get("volumes", []):
            cm = (v.get("configMap") or {}).get("name")
            if cm and cm not in configmaps:
                problems.append(f"{where}: mounts ConfigMap {cm}, not in the output")
        for c in t["spec"]["containers"]:
            ports = {p.get("name") for p in c.get("ports", [])}
            if d["kind"] == "Deployment":
                for probe in ("readinessProbe", "livenessProbe"):
                    p = c.get(probe)
                    if not p:
                        problems.append(f"{where}: container {c['name']} has no {probe}")
                    elif p["httpGet"]["port"] not in ports:
                        problems.append(f"{where}: {probe} port {p['httpGet']['port']} is not a container port")
                if not (c.get("resources") or {}).get("requests"):
                    problems.append(f"{where}: container {c['name']} has no resource requests")
        if d["kind"] == "Deployment":
            sel = d["spec"]["selector"]
            if not selector_match(sel, t["metadata"]["labels"]):
                problems.append(f"{where}: selector does not match its pod template")
    pod_labels = [t["metadata"]["labels"] for _, t in pods]
    for kind in ("Service", "PodDisruptionBudget"):
        for n, d in by_kind.get(kind, {}).items():
            sel = d["spec"]["selector"]
            sel = {"matchLabels": sel} if kind == "Service" else sel
            if not any(selector_match(sel, labels) for labels in pod_labels):
                problems.append(f"{name}: {kind}/{n} selects no pod")
    services = by_kind.get("Service", {})
    for n, d in by_kind.get("ServiceMonitor", {}).items():
        chosen = [s for s in services.values() if selector_match(d["spec"]["selector"], s["metadata"].get("labels", {}))]
        if not chosen:
            problems.append(f"{name}: ServiceMonitor/{n} selects no Service")
        for ep in d["spec"]["endpoints"]:
            for s in chosen:
                if ep["port"] not in {p.get("name") for p in s["spec"]["ports"]}:
                    problems.append(f"{name}: Service/{s['metadata']['name']} has no port {ep['port']}")
    for n, d in by_kind.get("ScaledObject", {}).items():
        target = d["spec"]["scaleTargetRef"]["name"]
        if target not in deployments:
            problems.append(f"{name}: ScaledObject/{n} scales Deployment {target}, not in the output")
        elif "replicas" in deployments[target]["spec"]:
            problems.append(f"{name}: Deployment {target} sets replicas although KEDA scales it")
    return by_kind


def summary(by_kind, problems, name):
    tomls = [cm["data"]["fairway.toml"] for cm in by_kind.get("ConfigMap", {}).values() if "fairway.toml" in cm.get("data", {})]
    if len(tomls) != 1:
        problems.append(f"{name}: want one ConfigMap with fairway.toml, found {len(tomls)}")
    grace = {}
    for d in by_kind.get("Deployment", {}).values():
        labels = d["spec"]["template"]["metadata"]["labels"]
        if labels.get("app.kubernetes.io/component") == "worker":
            grace[labels["fairway.dev/pool"]] = d["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30)
    return {"fairway_toml": tomls[0] if tomls else "", "grace_seconds": grace, "kinds": sorted(by_kind)}


def main(args):
    problems, out = [], {}
    for arg in args:
        name, path = arg.split("=", 1)
        with open(path) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        for d in docs:
            where = f"{name}: {d.get('kind')}/{(d.get('metadata') or {}).get('name')}"
            if (d.get("apiVersion"), d.get("kind")) in CUSTOM:
                check_custom(d, problems, where)
                continue
            for version in KUBERNETES_VERSIONS:
                try:
                    kubernetes_validate.validate(d, version, strict=True)
                except kubernetes_validate.ValidationError as e:
                    problems.append(f"{where} (Kubernetes {version}): {'.'.join(map(str, e.path))}: {e.message}")
                except kubernetes_validate.SchemaNotFoundError as e:
                    problems.append(f"{where}: no schema for it in Kubernetes {version} ({e})")
        by_kind = check_references(docs, problems, name)
        out[name] = summary(by_kind, problems, name)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
