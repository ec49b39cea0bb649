#!/usr/bin/env python3
"""Static checks of deploy/: config files, Kubernetes manifests, Dockerfile.

There is no Kubernetes schema validator in Debian 12 (kubeconform and
kubeval are not packaged), so this parses the manifests with python3-yaml and
checks the fields gradsync relies on: apiVersion/kind pairs, names, the
namespace, selectors that match their pod labels, ports that probes and
Services name, volumes that mounts name, probe handlers (one each; `grpc`
needs a numeric port), the container security settings, Prometheus
annotations that are strings and name a container port, and the flags in
container args and embedded config files.

Usage (deploy/validate.sh runs it):
  validate_deploy.py --deploy_dir DIR [--flags BINARY=FLAGS_FILE ...]
                     [--binary PATH ...]
FLAGS_FILE lists the flag names of BINARY (e.g. gradsync-coordinator), one
per line; configs and args of binaries without a list are checked for syntax
only. --binary: built executables whose shared libraries must all come from
the Dockerfile's runtime packages (needs ldd, dpkg and apt-cache).

Prints one line per problem and exits 1 if there was any.
"""

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys

try:
    import yaml
except ImportError:  # reported by the caller as a skip
    yaml = None

PROBLEMS = []
PENDING_NOTES = []
# BINARY -> flags the deploy files may use before the binary has them.
PENDING = {}
NAMESPACE = "gradsync"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
COMMAND_LINE_ONLY = {"config", "flagfile", "fromenv", "tryfromenv", "undefok",
                     "version", "only_check_args"}
API_VERSIONS = {
    "Namespace": "v1",
    "ConfigMap": "v1",
    "Service": "v1",
    "Deployment": "apps/v1",
    "DaemonSet": "apps/v1",
    "StatefulSet": "apps/v1",
}
WORKLOADS = ("Deployment", "DaemonSet", "StatefulSet")


def problem(where, what):
    PROBLEMS.append(f"{where}: {what}")


# ---------------------------------------------------------------------------
# Config files (the format of common/config_file.h)

def parse_config(text, where):
    """Returns [(line, key, value)], reporting syntax errors."""
    out, seen = [], {}
    for n, raw in enumerate(text.split("\n"), 1):
        line = raw.rstrip("\r").strip()
        if not line or line.startswith("#"):
            continue
        if "=" not in line:
            problem(f"{where}:{n}", f"expected 'key = value', got '{line}'")
            continue
        key, value = (s.strip() for s in line.split("=", 1))
        if not re.fullmatch(r"[A-Za-z0-9_]+", key):
            problem(f"{where}:{n}", f"bad key '{key}'")
            continue
        if value.startswith('"') and (len(value) < 2 or not value.endswith('"')):
            problem(f"{where}:{n}", f"unterminated quote in the value of '{key}'")
        if key in seen:
            problem(f"{where}:{n}", f"'{key}' is already set on line {seen[key]}")
        seen[key] = n
        if key in COMMAND_LINE_ONLY or key.startswith("help"):
            problem(f"{where}:{n}", f"'{key}' can only be given on the command line")
        out.append((n, key, value))
    return out


def check_flag(binary, flags, flag, where, what):
    """Reports `flag` unless `binary` has it (or it is pending)."""
    if flags is None or flag in flags:
        return
    if flag in PENDING.get(binary, ()):
        PENDING_NOTES.append(f"{where}: {what} (--{flag} is not a flag of {binary} yet)")
    else:
        problem(where, f"{what}: {binary} has no flag --{flag}")


def check_config(text, where, binary, flags):
    for n, key, _ in parse_config(text, where):
        check_flag(binary, flags, key, f"{where}:{n}", f"unknown key '{key}'")


def binary_of_config(path):
    """deploy/config/gradsyncd.conf -> gradsyncd."""
    return os.path.basename(path)[: -len(".conf")]


# ---------------------------------------------------------------------------
# systemd units: the policy (systemd-analyze checks the syntax)

def parse_unit(path):
    """{(section, key): [values]} of a unit file."""
    out, section = {}, None
    for line in open(path):
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
        elif "=" in line:
            k, v = line.split("=", 1)
            out.setdefault((section, k.strip()), []).append(v.strip())
    return out


def check_unit(path, where):
    name = os.path.basename(path)[: -len(".service")]
    u = parse_unit(path)

    def get(key):
        values = u.get(("Service", key))
        return values[-1] if values else None

    want = {
        "Type": "notify", "Restart": "on-failure", "NoNewPrivileges": "yes",
        "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
        "CapabilityBoundingSet": "", "AmbientCapabilities": "",
    }
    for key, value in want.items():
        if get(key) != value:
            problem(where, f"{key}={value} expected, found {get(key)!r}")
    if not get("WatchdogSec"):
        problem(where, "no WatchdogSec= (the binaries ping the watchdog)")
    exec_start = get("ExecStart") or ""
    if exec_start != f"/usr/bin/{name} --config=/etc/gradsync/{name}.conf":
        problem(where, f"ExecStart={exec_start!r}, expected /usr/bin/{name} "
                       f"--config=/etc/gradsync/{name}.conf")
    if get("User") in ("root", "0"):
        problem(where, "must not run as root")
    if not get("User") and get("DynamicUser") != "yes":
        problem(where, "needs User= or DynamicUser=yes")
    if ("Install", "WantedBy") not in u:
        problem(where, "no [Install] WantedBy=")
    if name == "gradsyncd":
        # Buffers are POSIX shm in the host's /dev/shm, shared with clients;
        # the client socket is in /run/gradsync.
        for key in ("PrivateDevices", "PrivateIPC", "RemoveIPC", "DynamicUser"):
            if get(key) == "yes":
                problem(where, f"{key}=yes would cut gradsyncd off from its clients' shared memory")
        if get("RuntimeDirectory") != "gradsync":
            problem(where, "RuntimeDirectory=gradsync expected (the client socket's directory)")


# ---------------------------------------------------------------------------
# Kubernetes

def check_meta(doc, where):
    meta = doc.get("metadata") or {}
    name = meta.get("name")
    if not isinstance(name, str) or not DNS_LABEL.match(name) or len(name) > 63:
        problem(where, f"metadata.name {name!r} is not a DNS label")
    if doc.get("kind") != "Namespace" and meta.get("namespace") != NAMESPACE:
        problem(where, f"metadata.namespace must be '{NAMESPACE}', is {meta.get('namespace')!r}")
    for field in ("labels", "annotations"):
        for k, v in (meta.get(field) or {}).items():
            if not isinstance(v, str):
                problem(where, f"{field} {k}: value {v!r} must be a string (quote it)")


def container_ports(container):
    return {p.get("name"): p.get("containerPort") for p in container.get("ports") or []}


def check_port_ref(port, ports, where):
    if isinstance(port, int):
        if not 1 <= port <= 65535:
            problem(where, f"port {port} out of range")
    elif port not in ports:
        problem(where, f"names port {port!r}, which the container does not declare")


def check_probe(probe, ports, where):
    handlers = [h for h in ("grpc", "httpGet", "tcpSocket", "exec") if h in probe]
    if len(handlers) != 1:
        problem(where, f"needs exactly one handler, has {handlers}")
        return
    h = handlers[0]
    if h == "grpc":
        if not isinstance(probe["grpc"].get("port"), int):
            problem(where, "grpc.port must be a number (named ports are not allowed)")
        else:
            check_port_ref(probe["grpc"]["port"], ports, where)
    elif h in ("httpGet", "tcpSocket"):
        check_port_ref(probe[h].get("port"), ports, where)


def check_args(container, flags_by_binary, where):
    command = container.get("command") or []
    args = container.get("args") or []
    if not isinstance(command, list) or not isinstance(args, list):
        problem(where, "command and args must be lists")
        return
    binary = os.path.basename(command[0]) if command else None
    flags = flags_by_binary.get(binary)
    for a in args:
        if not isinstance(a, str):
            problem(where, f"arg {a!r} must be a string")
            continue
        m = re.match(r"^--?([A-Za-z0-9_]+)(=|$)", a)
        if m:
            check_flag(binary, flags, m.group(1), where, f"arg '{a}'")


def check_container(c, volumes, flags_by_binary, where, init=False):
    name = c.get("name")
    where = f"{where} container {name}"
    if not isinstance(name, str) or not DNS_LABEL.match(name):
        problem(where, "bad or missing name")
    if not isinstance(c.get("image"), str):
        problem(where, "no image")
    ports = container_ports(c)
    for pname, pnum in ports.items():
        if not isinstance(pname, str) or len(pname) > 15 or not DNS_LABEL.match(pname):
            problem(where, f"port name {pname!r} must be a DNS label of at most 15 characters")
        if not isinstance(pnum, int) or not 1 <= pnum <= 65535:
            problem(where, f"containerPort {pnum!r} out of range")
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        if probe in c:
            check_probe(c[probe], ports, f"{where} {probe}")
    if not init and "readinessProbe" not in c:
        problem(where, "no readinessProbe")
    for m in c.get("volumeMounts") or []:
        if m.get("name") not in volumes:
            problem(where, f"mounts volume {m.get('name')!r}, which the pod does not declare")
        if not str(m.get("mountPath", "")).startswith("/"):
            problem(where, f"mountPath {m.get('mountPath')!r} is not absolute")
    sc = c.get("securityContext") or {}
    if sc.get("allowPrivilegeEscalation") is not False:
        problem(where, "securityContext.allowPrivilegeEscalation must be false")
    if sc.get("readOnlyRootFilesystem") is not True:
        problem(where, "securityContext.readOnlyRootFilesystem must be true")
    if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
        problem(where, "securityContext.capabilities.drop must contain ALL")
    if sc.get("privileged"):
        problem(where, "must not be privileged")
    for e in c.get("env") or []:
        if "value" not in e and "valueFrom" not in e:
            problem(where, f"env {e.get('name')!r} has neither value nor valueFrom")
    check_args(c, flags_by_binary, where)
    return ports


def check_workload(doc, where, flags_by_binary):
    spec = doc.get("spec") or {}
    template = spec.get("template") or {}
    labels = (template.get("metadata") or {}).get("labels") or {}
    selector = (spec.get("selector") or {}).get("matchLabels") or {}
    if not selector:
        problem(where, "spec.selector.matchLabels is empty")
    for k, v in selector.items():
        if labels.get(k) != v:
            problem(where, f"selector {k}={v} does not match the pod template's labels")
    pod = template.get("spec") or {}
    volumes = {v.get("name") for v in pod.get("volumes") or []}
    all_ports = {}
    containers = pod.get("containers") or []
    if not containers:
        problem(where, "no containers")
    for c in containers:
        all_ports.update(check_container(c, volumes, flags_by_binary, where))
    for c in pod.get("initContainers") or []:
        check_container(c, volumes, flags_by_binary, where, init=True)
    psc = pod.get("securityContext") or {}
    if (psc.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
        problem(where, "pod securityContext.seccompProfile.type must be RuntimeDefault")
    if pod.get("hostNetwork") and pod.get("dnsPolicy") != "ClusterFirstWithHostNet":
        problem(where, "hostNetwork pods need dnsPolicy ClusterFirstWithHostNet to resolve Services")
    for v in pod.get("volumes") or []:
        hp = v.get("hostPath")
        if hp is not None and not str(hp.get("path", "")).startswith("/"):
            problem(where, f"hostPath of volume {v.get('name')} is not absolute")
        cm = v.get("configMap")
        if cm is not None and not cm.get("name"):
            problem(where, f"configMap volume {v.get('name')} has no name")
    ann = (template.get("metadata") or {}).get("annotations") or {}
    for k, v in ann.items():
        if not isinstance(v, str):
            problem(where, f"pod annotation {k}: {v!r} must be a string (quote it)")
    if "prometheus.io/port" in ann:
        try:
            port = int(ann["prometheus.io/port"])
        except (TypeError, ValueError):
            problem(where, f"prometheus.io/port {ann['prometheus.io/port']!r} is not a number")
        else:
            if port not in all_ports.values():
                problem(where, f"prometheus.io/port {port} is not a container port")
    if doc["kind"] == "Deployment" and spec.get("replicas", 1) < 1:
        problem(where, "replicas < 1")
    return labels, all_ports, pod


def check_k8s(deploy_dir, flags_by_binary):
    docs = []
    for path in sorted(glob.glob(os.path.join(deploy_dir, "k8s", "*.yaml"))):
        rel = os.path.relpath(path, os.path.dirname(deploy_dir))
        try:
            with open(path) as f:
                loaded = list(yaml.safe_load_all(f))
        except yaml.YAMLError as e:
            problem(rel, f"YAML does not parse: {e}")
            continue
        for i, doc in enumerate(loaded):
            if doc is None:
                continue
            docs.append((f"{rel}#{i + 1} {doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}",
                         rel, doc))

    kustomization = None
    objects = []
    for where, rel, doc in docs:
        if not isinstance(doc, dict):
            problem(where, "not a mapping")
            continue
        if doc.get("kind") == "Kustomization":
            kustomization = (where, rel, doc)
            continue
        kind = doc.get("kind")
        if kind not in API_VERSIONS:
            problem(where, f"unexpected kind {kind!r}")
            continue
        if doc.get("apiVersion") != API_VERSIONS[kind]:
            problem(where, f"apiVersion {doc.get('apiVersion')!r}, expected {API_VERSIONS[kind]!r}")
        check_meta(doc, where)
        objects.append((where, doc))

    workloads = []  # (where, doc, labels, ports, pod)
    for where, doc in objects:
        if doc["kind"] in WORKLOADS:
            labels, ports, pod = check_workload(doc, where, flags_by_binary)
            workloads.append((where, doc, labels, ports, pod))
        elif doc["kind"] == "ConfigMap":
            for key, text in (doc.get("data") or {}).items():
                if not isinstance(text, str):
                    problem(where, f"data.{key} must be a string")
                elif key.endswith(".conf"):
                    binary = key[: -len(".conf")]
                    check_config(text, f"{where} data.{key}", binary,
                                 flags_by_binary.get(binary))

    by_name = {(d["kind"], d["metadata"]["name"]) for _, d in objects}
    services = [(w, d) for w, d in objects if d["kind"] == "Service"]
    for where, doc in services:
        spec = doc.get("spec") or {}
        selector = spec.get("selector") or {}
        matches = [w for w in workloads if all(w[2].get(k) == v for k, v in selector.items())]
        if not selector or not matches:
            problem(where, f"selector {selector} matches no workload's pods")
            continue
        ports = matches[0][3]
        for p in spec.get("ports") or []:
            if not isinstance(p.get("port"), int):
                problem(where, f"port {p.get('port')!r} is not a number")
            check_port_ref(p.get("targetPort", p.get("port")), ports, f"{where} port {p.get('name')}")
    for where, doc, _, _, pod in workloads:
        if doc["kind"] == "StatefulSet":
            svc = (doc.get("spec") or {}).get("serviceName")
            match = [d for _, d in services if d["metadata"]["name"] == svc]
            if not match:
                problem(where, f"serviceName {svc!r} names no Service")
            elif (match[0].get("spec") or {}).get("clusterIP") != "None":
                problem(where, f"Service {svc} must be headless (clusterIP: None)")
        for v in pod.get("volumes") or []:
            cm = (v.get("configMap") or {}).get("name")
            if cm and ("ConfigMap", cm) not in by_name:
                problem(where, f"volume {v.get('name')} names ConfigMap {cm!r}, which is not defined")

    if kustomization is None:
        problem("k8s/", "no kustomization.yaml")
    else:
        where, rel, doc = kustomization
        for r in doc.get("resources") or []:
            if not os.path.exists(os.path.join(deploy_dir, "k8s", r)):
                problem(where, f"resource {r} does not exist")
    return len(objects)


# ---------------------------------------------------------------------------
# Prometheus example configs (promtool checks them too, where it can)

def check_prometheus(deploy_dir):
    files = sorted(glob.glob(os.path.join(deploy_dir, "prometheus", "*.yml")))
    for path in files:
        where = os.path.relpath(path, os.path.dirname(deploy_dir))
        try:
            doc = yaml.safe_load(open(path))
        except yaml.YAMLError as e:
            problem(where, f"YAML does not parse: {e}")
            continue
        jobs = [c.get("job_name") for c in doc.get("scrape_configs") or []]
        if not jobs or len(set(jobs)) != len(jobs):
            problem(where, f"scrape job names must exist and be unique: {jobs}")
        for c in doc.get("scrape_configs") or []:
            for r in c.get("relabel_configs") or []:
                if "regex" in r:
                    try:
                        re.compile(str(r["regex"]))
                    except re.error as e:
                        problem(where, f"job {c.get('job_name')}: bad regex {r['regex']!r}: {e}")
    return len(files)


# ---------------------------------------------------------------------------
# Dockerfile

def dockerfile_runtime_packages(path):
    """The packages the last stage apt-get installs, and the stage names."""
    text = open(path).read().replace("\\\n", " ")
    stages, runtime_packages = [], []
    for line in text.split("\n"):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if words[0].upper() == "FROM":
            if len(words) >= 4 and words[2].upper() == "AS":
                stages.append(words[3])
            else:
                stages.append(None)
            runtime_packages = []
        elif words[0].upper() == "COPY":
            for w in words:
                if w.startswith("--from="):
                    src = w[len("--from="):]
                    if src not in stages:
                        problem(os.path.basename(path), f"COPY --from={src}: no such earlier stage")
        elif words[0].upper() == "RUN" and "install" in words:
            i = words.index("install")
            for w in words[i + 1:]:
                if w in ("&&", ";", "|"):
                    break
                if not w.startswith("-"):
                    runtime_packages.append(w)
    if len(stages) < 2:
        problem(os.path.basename(path), "expected a multi-stage build (build + runtime)")
    return runtime_packages


def apt_closure(packages):
    out = subprocess.run(
        ["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests", "--no-conflicts",
         "--no-breaks", "--no-replaces", "--no-enhances"] + packages,
        capture_output=True, text=True)
    return {l.strip() for l in out.stdout.split("\n") if l and not l.startswith(" ")}


def packages_of(libs):
    """{lib: Debian package or None}, with one dpkg -S call. dpkg knows a
    file by the path its package installed, which may differ from ldd's
    (usr-merge: /lib vs /usr/lib; symlinks to the real file)."""
    candidates = {}
    for lib in libs:
        paths = []
        for c in (lib, os.path.realpath(lib)):
            for p in (c, re.sub(r"^/usr/lib/", "/lib/", c), re.sub(r"^/lib/", "/usr/lib/", c)):
                if p not in paths:
                    paths.append(p)
        candidates[lib] = paths
    all_paths = sorted({p for paths in candidates.values() for p in paths})
    out = subprocess.run(["dpkg", "-S"] + all_paths, capture_output=True, text=True)
    owner = {}
    for line in out.stdout.split("\n"):
        if ": " in line:
            pkgs, path = line.split(": ", 1)
            owner[path.strip()] = pkgs.split(",")[0].strip()
    return {lib: next((owner[p] for p in paths if p in owner), None)
            for lib, paths in candidates.items()}


def check_dockerfile(deploy_dir, binaries):
    path = os.path.join(deploy_dir, "Dockerfile")
    if not os.path.exists(path):
        problem("Dockerfile", "missing")
        return "missing"
    packages = dockerfile_runtime_packages(path)
    if not packages:
        problem("Dockerfile", "the runtime stage installs no packages")
        return "no packages"
    if not shutil.which("apt-cache"):
        return "package checks skipped (no apt-cache)"
    missing = [p for p in packages
               if subprocess.run(["apt-cache", "show", p], capture_output=True).returncode != 0]
    if len(missing) == len(packages):
        return "package checks skipped (apt-cache knows no packages: run apt-get update)"
    for p in missing:
        problem("Dockerfile", f"runtime package {p} is not in the Debian archive")
    if not binaries:
        return f"{len(packages)} runtime packages exist"
    if not (shutil.which("ldd") and shutil.which("dpkg")):
        return f"{len(packages)} runtime packages exist; library check skipped (no ldd/dpkg)"
    closure = apt_closure(packages)
    libs = set()
    for b in binaries:
        out = subprocess.run(["ldd", b], capture_output=True, text=True)
        for line in out.stdout.split("\n"):
            m = re.search(r"=> (/\S+)", line)
            if m:
                libs.add(m.group(1))
            elif "not found" in line:
                problem("Dockerfile", f"{b}: {line.strip()}")
    owners = packages_of(sorted(libs))
    for lib in sorted(libs):
        pkg = owners[lib]
        if pkg is None:
            problem("Dockerfile", f"{lib} (needed by the binaries) belongs to no Debian package")
        elif pkg.split(":")[0] not in closure:
            problem("Dockerfile", f"{lib} comes from {pkg}, which the runtime stage does not install")
    return (f"{len(packages)} runtime packages exist and provide all {len(libs)} shared libraries "
            f"of {len(binaries)} binaries")


# ---------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deploy_dir", required=True)
    ap.add_argument("--flags", action="append", default=[], help="BINARY=FLAGS_FILE")
    ap.add_argument("--binary", action="append", default=[])
    ap.add_argument("--pending", action="append", default=[],
                    help="BINARY=FLAG,FLAG: flags the deploy files may use before BINARY has "
                         "them (reported, not failed)")
    args = ap.parse_args()
    deploy_dir = os.path.abspath(args.deploy_dir)

    for spec in args.pending:
        name, flags = spec.split("=", 1)
        PENDING[name] = set(f for f in flags.split(",") if f)
    flags_by_binary = {}
    for spec in args.flags:
        name, path = spec.split("=", 1)
        with open(path) as f:
            flags_by_binary[name] = {l.strip() for l in f if l.strip()}

    units = sorted(glob.glob(os.path.join(deploy_dir, "systemd", "*.service")))
    for path in units:
        check_unit(path, os.path.relpath(path, os.path.dirname(deploy_dir)))
        name = os.path.basename(path)[: -len(".service")]
        if not os.path.exists(os.path.join(deploy_dir, "config", f"{name}.conf")):
            problem(os.path.relpath(path, os.path.dirname(deploy_dir)),
                    f"no config/{name}.conf for its --config")
    print(f"systemd units: {len(units)} checked against the policy (notify, watchdog, "
          f"restart, sandbox, no capabilities, --config)")

    configs = sorted(glob.glob(os.path.join(deploy_dir, "config", "*.conf")))
    for path in configs:
        with open(path) as f:
            check_config(f.read(), os.path.relpath(path, os.path.dirname(deploy_dir)),
                         binary_of_config(path), flags_by_binary.get(binary_of_config(path)))
    checked = [b for b in (binary_of_config(p) for p in configs) if b in flags_by_binary]
    print(f"config files: {len(configs)} parsed; keys checked against the flags of "
          f"{', '.join(checked) or 'no binary'}")

    if yaml is None:
        print("SKIP k8s: python3-yaml is not installed (apt-get install python3-yaml)")
    else:
        n = check_k8s(deploy_dir, flags_by_binary)
        print(f"k8s: {n} objects checked (python3-yaml + the checks in this file)")
        print(f"prometheus: {check_prometheus(deploy_dir)} example configs parsed")

    print(f"Dockerfile: {check_dockerfile(deploy_dir, args.binary)}")

    for note in PENDING_NOTES:
        print(f"PENDING {note}")
    for name, flags in sorted(flags_by_binary.items()):
        for f in sorted(PENDING.get(name, ())):
            if f in flags:
                print(f"PENDING --{f} is now a flag of {name}: drop it from validate.sh's pending list")
    for p in PROBLEMS:
        print(f"PROBLEM {p}")
    return 1 if PROBLEMS else 0


if __name__ == "__main__":
    sys.exit(main())
