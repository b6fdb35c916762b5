"""Checks of the rendered Kubernetes manifests (scripts/kubernetes-check.sh
renders deploy/kubernetes/ into $K8S_RENDERED first, then runs this with
`python -m unittest`).

- Every pod the manifests make meets the Pod Security Standards'
  "restricted" profile (each rule of the profile, below), plus a read-only
  root file system.
- The gateway's Deployment: readiness on /readyz, liveness on /healthz, a
  preStop pause and a termination grace above the config's
  server.shutdown_grace_secs; the config is a ConfigMap mounted as a
  directory (no subPath: the kubelet's update would never reach it);
  every secret the config names by variable comes from a Secret.
- The selectors of the Service, PodDisruptionBudget, NetworkPolicies and
  ServiceMonitor match the pods they are for; the fleet's config names the
  stores' Services; the Ingress example routes /v1/ alone.
- The ServiceMonitor (a CRD: the validator has no schema for it) is checked
  for shape here; the dashboard ConfigMap is deploy/grafana/budgetgate.json.
- The CI-only overlay tests/kubernetes/podman (what scripts/kube-play.sh
  runs) differs from overlays/fleet plus the stores only where its
  kustomization.yaml says.
"""

import json
import os
import pathlib
import tomllib
import unittest
import urllib.parse

import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
RENDERED = pathlib.Path(os.environ.get("K8S_RENDERED", REPO / "target/kubernetes/rendered"))
EXAMPLES = REPO / "deploy/kubernetes/examples"

# The volume types the restricted profile allows.
RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
    "persistentVolumeClaim", "projected", "secret",
}
GATEWAY = {"app.kubernetes.io/name": "budgetgate", "app.kubernetes.io/component": "gateway"}


def load(name):
    with open(RENDERED / f"{name}.yaml") as f:
        return [d for d in yaml.safe_load_all(f) if d]


def one(objects, kind, name=None):
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''}"
    return found[0]


def pod_specs(objects):
    """(object name, pod spec) of every workload."""
    for o in objects:
        if o["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet"):
            yield o["metadata"]["name"], o["spec"]["template"]["spec"]
        elif o["kind"] == "Pod":
            yield o["metadata"]["name"], o["spec"]


def selects(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


def config_of(objects):
    cm = one(objects, "ConfigMap", "budgetgate-config")
    return tomllib.loads(cm["data"]["budgetgate.toml"])


def env_of(container):
    return {e["name"]: e for e in container.get("env", [])}


class Restricted(unittest.TestCase):
    """The Pod Security Standards' restricted profile, rule by rule."""

    def check(self, name, spec):
        where = f"{name}"
        psc = spec.get("securityContext", {})
        for field in ("hostNetwork", "hostPID", "hostIPC"):
            self.assertFalse(spec.get(field, False), f"{where}: {field}")
        for v in spec.get("volumes", []):
            kinds = set(v) - {"name"}
            self.assertTrue(kinds <= RESTRICTED_VOLUMES, f"{where}: volume {v['name']} is {kinds}")
        for s in psc.get("sysctls", []):
            self.fail(f"{where}: sysctl {s['name']}")
        self.assertNotEqual(psc.get("runAsUser"), 0, f"{where}: pod runs as root")
        containers = spec.get("containers", []) + spec.get("initContainers", [])
        self.assertTrue(containers)
        for c in containers:
            at = f"{where}/{c['name']}"
            sc = c.get("securityContext", {})
            self.assertFalse(sc.get("privileged", False), f"{at}: privileged")
            self.assertIs(sc.get("allowPrivilegeEscalation"), False, f"{at}: allowPrivilegeEscalation")
            caps = sc.get("capabilities", {})
            self.assertIn("ALL", caps.get("drop", []), f"{at}: capabilities not dropped")
            self.assertTrue(set(caps.get("add", [])) <= {"NET_BIND_SERVICE"}, f"{at}: {caps}")
            non_root = sc.get("runAsNonRoot", psc.get("runAsNonRoot"))
            self.assertIs(non_root, True, f"{at}: runAsNonRoot")
            self.assertNotEqual(sc.get("runAsUser", psc.get("runAsUser")), 0, f"{at}: runAsUser 0")
            seccomp = sc.get("seccompProfile", psc.get("seccompProfile", {})).get("type")
            self.assertIn(seccomp, ("RuntimeDefault", "Localhost"), f"{at}: seccompProfile")
            for p in c.get("ports", []):
                self.assertNotIn("hostPort", p, f"{at}: hostPort")
            for field in ("procMount",):
                self.assertIn(sc.get(field, "Default"), ("Default",), f"{at}: {field}")
            self.assertIs(sc.get("readOnlyRootFilesystem"), True, f"{at}: readOnlyRootFilesystem")

    def test_every_pod_of_every_kustomization(self):
        pods = 0
        for name in ("single", "fleet", "stores", "monitoring"):
            for workload, spec in pod_specs(load(name)):
                with self.subTest(kustomization=name, workload=workload):
                    self.check(workload, spec)
                    pods += 1
        self.assertGreaterEqual(pods, 4)

    def test_the_check_fails_on_a_pod_that_breaks_the_profile(self):
        _, spec = next(pod_specs(load("fleet")))
        broken = json.loads(json.dumps(spec))
        broken["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
        with self.assertRaises(AssertionError):
            self.check("broken", broken)
        broken = json.loads(json.dumps(spec))
        broken["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
        with self.assertRaises(AssertionError):
            self.check("broken", broken)


class Gateway(unittest.TestCase):
    def check(self, name):
        objects = load(name)
        deployment = one(objects, "Deployment", "budgetgate")
        spec = deployment["spec"]["template"]["spec"]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        config = config_of(objects)
        (c,) = spec["containers"]

        self.assertEqual(c["readinessProbe"]["httpGet"]["path"], "/readyz")
        self.assertEqual(c["livenessProbe"]["httpGet"]["path"], "/healthz")
        self.assertIn("preStop", c["lifecycle"])
        grace = config["server"].get("shutdown_grace_secs", 30)
        pre_stop = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
        # The pause, the grace, the cut-off (5 s) and the ledger's last write (5 s).
        self.assertGreaterEqual(spec["terminationGracePeriodSeconds"], pre_stop + grace + 10)

        # The config: a ConfigMap mounted as a directory.
        volumes = {v["name"]: v for v in spec["volumes"]}
        mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
        config_mount = mounts["/etc/budgetgate"]
        self.assertNotIn("subPath", config_mount)
        self.assertTrue(all("subPath" not in m for m in c["volumeMounts"]))
        self.assertEqual(volumes[config_mount["name"]]["configMap"]["name"], "budgetgate-config")
        self.assertEqual(env_of(c)["BUDGETGATE_CONFIG"]["value"], "/etc/budgetgate/budgetgate.toml")
        # State and /tmp writable on a read-only root.
        for path in ("/var/lib/budgetgate", "/tmp"):
            self.assertIn(path, mounts)
        self.assertGreater(len(spec["securityContext"]), 0)

        # Every secret the config reads from a variable comes from a Secret.
        names = [config["server"].get("admin_token_env", "BUDGETGATE_ADMIN_TOKEN")]
        names += [u["api_key_env"] for u in config.get("upstreams", []) if "api_key_env" in u]
        env = env_of(c)
        for n in names:
            self.assertIn("secretKeyRef", env[n].get("valueFrom", {}), f"{name}: {n}")
        cm = one(objects, "ConfigMap", "budgetgate-config")
        self.assertEqual(set(cm["data"]), {"budgetgate.toml"})
        self.assertNotIn("api_key =", cm["data"]["budgetgate.toml"])

        # Resources requested; the selectors find the pods.
        self.assertIn("requests", c["resources"])
        self.assertTrue(selects(GATEWAY, labels))
        self.assertEqual(deployment["spec"]["selector"]["matchLabels"], GATEWAY)
        self.assertTrue(selects(one(objects, "Service", "budgetgate")["spec"]["selector"], labels))
        self.assertTrue(selects(one(objects, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"], labels))
        policy = one(objects, "NetworkPolicy", "budgetgate")
        self.assertTrue(selects(policy["spec"]["podSelector"]["matchLabels"], labels))
        port_names = {p["name"] for p in c["ports"]}
        for rule in policy["spec"]["ingress"]:
            for p in rule["ports"]:
                self.assertIn(p["port"], port_names)
        return deployment, config

    def test_single(self):
        deployment, config = self.check("single")
        self.assertEqual(deployment["spec"]["replicas"], 1)
        self.assertEqual(deployment["spec"]["strategy"], {"type": "Recreate"})
        self.assertEqual(config["store"]["kind"], "memory")
        self.assertNotIn("control", config)  # SQLite in the state directory
        volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
        claim = volumes["state"]["persistentVolumeClaim"]["claimName"]
        one(load("single"), "PersistentVolumeClaim", claim)

    def test_fleet(self):
        deployment, config = self.check("fleet")
        replicas = deployment["spec"]["replicas"]
        self.assertGreaterEqual(replicas, 2)
        self.assertEqual(deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"], 0)
        self.assertEqual(config["store"]["kind"], "redis")
        self.assertEqual(config["store"]["lease"]["fleet_size"], replicas)
        self.assertLessEqual(config["store"]["fallback_share"] * replicas, 1.02)
        (c,) = deployment["spec"]["template"]["spec"]["containers"]
        self.assertIn("secretKeyRef", env_of(c)["PGPASSWORD"]["valueFrom"])
        # The stores' Services, and their policy admits the gateways.
        stores = load("stores")
        services = {s["metadata"]["name"]: s for s in stores if s["kind"] == "Service"}
        for url in (config["store"]["url"], config["control"]["database_url"]):
            u = urllib.parse.urlsplit(url)
            self.assertIn(u.hostname, services, url)
            self.assertIn(u.port, [p["port"] for p in services[u.hostname]["spec"]["ports"]])
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        policy = one(stores, "NetworkPolicy")
        for rule in policy["spec"]["ingress"]:
            self.assertTrue(any(selects(p["podSelector"]["matchLabels"], labels) for p in rule["from"]))
        for workload, _ in pod_specs(stores):
            w = one(stores, "Deployment", workload)
            self.assertTrue(selects(policy["spec"]["podSelector"]["matchLabels"],
                                    w["spec"]["template"]["metadata"]["labels"]))
        # The gateways' own egress reaches the stores' pods.
        gateway_policy = one(load("fleet"), "NetworkPolicy", "budgetgate")
        store_labels = [one(stores, "Deployment", w)["spec"]["template"]["metadata"]["labels"]
                        for w, _ in pod_specs(stores)]
        for sl in store_labels:
            self.assertTrue(any(selects(peer.get("podSelector", {}).get("matchLabels", {"-": "-"}), sl)
                                for rule in gateway_policy["spec"]["egress"] for peer in rule.get("to", [])))
        # The fleet overlay holds no store: deleting it never deletes data.
        self.assertFalse([o for o in load("fleet") if o["kind"] == "PersistentVolumeClaim"])


class Monitoring(unittest.TestCase):
    def test_service_monitor_shape(self):
        sm = one(load("monitoring"), "ServiceMonitor")
        self.assertEqual(sm["apiVersion"], "monitoring.coreos.com/v1")
        service = one(load("fleet"), "Service", "budgetgate")
        self.assertTrue(selects(sm["spec"]["selector"]["matchLabels"], service["metadata"]["labels"]))
        self.assertEqual(set(sm["spec"]), {"selector", "endpoints"})
        (endpoint,) = sm["spec"]["endpoints"]
        self.assertEqual(set(endpoint), {"port", "path", "interval"})
        self.assertIn(endpoint["port"], [p["name"] for p in service["spec"]["ports"]])
        self.assertEqual(endpoint["path"], "/metrics")
        self.assertRegex(endpoint["interval"], r"^[0-9]+s$")
        self.assertEqual(sm["metadata"]["namespace"], service["metadata"]["namespace"])

    def test_dashboard_is_the_shipped_one(self):
        cm = one(load("monitoring"), "ConfigMap", "budgetgate-dashboard")
        self.assertEqual(cm["metadata"]["labels"]["grafana_dashboard"], "1")
        shipped = (REPO / "deploy/grafana/budgetgate.json").read_text()
        self.assertEqual(cm["data"]["budgetgate.json"], shipped)


class PublicPath(unittest.TestCase):
    def test_the_ingress_routes_v1_alone(self):
        with open(EXAMPLES / "ingress.yaml") as f:
            ingress = yaml.safe_load(f)
        service = one(load("fleet"), "Service", "budgetgate")
        paths = [p for rule in ingress["spec"]["rules"] for p in rule["http"]["paths"]]
        self.assertTrue(paths)
        for p in paths:
            self.assertEqual(p["path"], "/v1/")
            self.assertEqual(p["pathType"], "Prefix")
            backend = p["backend"]["service"]
            self.assertEqual(backend["name"], service["metadata"]["name"])
            self.assertIn(backend["port"]["name"], [q["name"] for q in service["spec"]["ports"]])
        self.assertEqual(ingress["metadata"]["namespace"], service["metadata"]["namespace"])

    def test_the_autoscaler_targets_the_gateways(self):
        with open(EXAMPLES / "horizontalpodautoscaler.yaml") as f:
            hpa = yaml.safe_load(f)
        target = hpa["spec"]["scaleTargetRef"]
        one(load("fleet"), target["kind"], target["name"])
        config = config_of(load("fleet"))
        self.assertLessEqual(config["store"]["lease"]["fleet_size"], hpa["spec"]["maxReplicas"])


class PodmanOverlay(unittest.TestCase):
    """tests/kubernetes/podman against overlays/fleet + stores: undo each
    difference its kustomization.yaml names, and the rest is identical."""

    def test_differs_from_fleet_only_where_it_says(self):
        fleet = {(o["kind"], o["metadata"]["name"]): o for o in load("fleet") + load("stores")}
        podman = {(o["kind"], o["metadata"]["name"]): o for o in load("podman")}
        added = set(podman) - set(fleet)
        self.assertEqual(added, {("Deployment", "budgetgate-b"), ("Deployment", "upstream")})
        self.assertEqual(set(fleet) - set(podman), set())

        def gateway_as_fleet(d, name):
            d = json.loads(json.dumps(d))
            d["metadata"]["name"] = name
            d["spec"]["replicas"] = fleet[("Deployment", "budgetgate")]["spec"]["replicas"]
            (c,) = d["spec"]["template"]["spec"]["containers"]
            self.assertEqual(c["image"], "localhost/budgetgate:ci")
            c["image"] = fleet[("Deployment", "budgetgate")]["spec"]["template"]["spec"]["containers"][0]["image"]
            port = c["ports"][0]
            self.assertEqual(port.pop("hostIP"), "127.0.0.1")
            self.assertIsInstance(port.pop("hostPort"), int)
            return d

        for name in ("budgetgate", "budgetgate-b"):
            self.assertEqual(podman[("Deployment", name)]["spec"]["replicas"], 1)
            self.assertEqual(gateway_as_fleet(podman[("Deployment", name)], "budgetgate"),
                             fleet[("Deployment", "budgetgate")], name)
        for name in ("budgetgate-redis", "budgetgate-postgres"):
            d = json.loads(json.dumps(podman[("Deployment", name)]))
            c = d["spec"]["template"]["spec"]["containers"][0]
            want = fleet[("Deployment", name)]["spec"]["template"]["spec"]["containers"][0]
            self.assertNotIn("ports", c)
            c["ports"] = want["ports"]
            if name == "budgetgate-postgres":
                self.assertEqual(c.pop("args"), ["postgres", "-c", "unix_socket_directories=/tmp"])
                self.assertEqual(c["env"].pop(), {"name": "PGHOST", "value": "/tmp"})
            self.assertEqual(d, fleet[("Deployment", name)], name)

        config = podman[("ConfigMap", "budgetgate-config")]
        want = fleet[("ConfigMap", "budgetgate-config")]
        changed = [(a, b) for a, b in zip(want["data"]["budgetgate.toml"].splitlines(),
                                          config["data"]["budgetgate.toml"].splitlines()) if a != b]
        self.assertEqual(changed, [('base_url = "https://api.openai.com/v1"', 'base_url = "http://upstream:9000/v1"')])
        self.assertEqual(len(want["data"]["budgetgate.toml"].splitlines()),
                         len(config["data"]["budgetgate.toml"].splitlines()))
        config = json.loads(json.dumps(config))
        config["data"] = want["data"]
        self.assertEqual(config, want)

        for key in set(fleet) - {("Deployment", n) for n in ("budgetgate", "budgetgate-redis", "budgetgate-postgres")} \
                - {("ConfigMap", "budgetgate-config")}:
            self.assertEqual(podman[key], fleet[key], key)


if __name__ == "__main__":
    unittest.main()
