"""Checks a Kubernetes manifest of examples/k8s against hoop_init_from_env, with no cluster.

    k8s_contract.py MANIFEST --build DIR --src DIR [--extra-args ARGS]

It does what Kubernetes (an indexed Job with its headless Service) or Kubeflow's training operator
(a PyTorchJob) would do for each pod: the variables of the pod's container, with $(VAR)
references expanded and the values Kubernetes adds (JOB_COMPLETION_INDEX; MASTER_ADDR,
MASTER_PORT, RANK and WORLD_SIZE from the operator), the Secret volumes as files of their
defaultMode, and the pod's host name. It checks that the rendezvous address the pods are given
names the pod that hosts it (index 0, or the master), then starts every pod's command here at
once, as processes of this machine, and requires each to exit 0. Stand-ins, all printed: that
pod's DNS name becomes 127.0.0.1, its port a free one (29400 may be taken here), each pod's host
name is HOOP_HOSTNAME (pods share no memory: hoop must see them as hosts of their own), the
image's paths are this tree's (sgd: examples/sgd/sgd; /opt/hoop/: the source tree).
"""

import argparse
import atexit
import fcntl
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile

import yaml

parser = argparse.ArgumentParser()
parser.add_argument("manifest")
parser.add_argument("--build", required=True)
parser.add_argument("--src", required=True)
parser.add_argument("--extra-args", default="", help="appended to every pod's command")
parser.add_argument("--timeout", type=float, default=300)
opts = parser.parse_args()
work = tempfile.mkdtemp(prefix="hoop-k8s-")
atexit.register(shutil.rmtree, work, True)


def fail(why):
    print("FAIL: %s: %s" % (os.path.basename(opts.manifest), why))
    sys.exit(1)


# Locks this process keeps: the ports reserved below stay reserved until it exits.
_port_locks = []


def free_port(pair=False):
    """A port (and the next, with pair) reserved as procs_free_port and ports.sh reserve them:
    below the ephemeral range, locked through /tmp/hoop-test-ports, none listening now."""
    span = 2 if pair else 1
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    first = max(1024, low - 12000)
    os.makedirs("/tmp/hoop-test-ports", mode=0o1777, exist_ok=True)
    for tries in range(4000):
        port = first + (os.getpid() * 7919 + tries * 131) % (low - first - span)
        held = []
        for p in range(port, port + span):
            path = "/tmp/hoop-test-ports/%d" % p
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o666)
            except OSError:
                break
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                with socket.socket() as s:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    s.bind(("127.0.0.1", p))
            except OSError:
                os.close(fd)
                break
            held.append(fd)
        if len(held) == span:
            _port_locks.extend(held)
            return port
        for fd in held:
            os.close(fd)
    fail("no free port")


def expand(value, env):
    """Kubernetes' $(VAR) references to variables defined before; $$ escapes."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), value)


def field(path, pod):
    known = {
        "metadata.name": pod["name"],
        "metadata.namespace": "default",
        "status.podIP": "127.0.0.1",
        "spec.nodeName": pod["hostname"],
        "metadata.annotations['batch.kubernetes.io/job-completion-index']": str(pod.get("index")),
        "metadata.labels['batch.kubernetes.io/job-completion-index']": str(pod.get("index")),
    }
    if path not in known or known[path] == "None":
        fail("env fieldRef %s: not one this check knows how Kubernetes fills" % path)
    return known[path]


def pod_env(container, pod, added):
    """The container's variables as Kubernetes sets them: what it adds first, then the list."""
    env = dict(added)
    for item in container.get("env", []):
        name = item["name"]
        if "value" in item:
            env[name] = expand(str(item["value"]), env)
        elif "fieldRef" in item.get("valueFrom", {}):
            env[name] = field(item["valueFrom"]["fieldRef"]["fieldPath"], pod)
        else:
            fail("env %s: only value and fieldRef are understood here" % name)
    return env


def mounts(template, container):
    """Secret volumes as files of their defaultMode under work/; {mountPath: local folder}."""
    volumes = {v["name"]: v for v in template["spec"].get("volumes", [])}
    out = {}
    for mount in container.get("volumeMounts", []):
        volume = volumes.get(mount["name"])
        if not volume or "secret" not in volume:
            fail("volume %s: only Secret volumes are understood here" % mount["name"])
        secret = volume["secret"]
        local = os.path.join(work, "secret-" + secret["secretName"])
        if not os.path.isdir(local):
            os.makedirs(local)
            # The Secret every manifest's comment says to create: one key, token.
            path = os.path.join(local, "token")
            with open(path, "w") as f:
                f.write("k8s-contract-test-token-0123456789abcdef\n")
            os.chmod(path, secret.get("defaultMode", 0o644))
        out[mount["mountPath"]] = local
    return out


def localize(pods, host0_names, port_key):
    """The stand-ins: the hosting pod's names -> 127.0.0.1, its port -> a free one, image paths ->
    this tree's, the pod's host name -> HOOP_HOSTNAME."""
    new_port = {}
    for pod in pods:
        env = pod["env"]
        for key in ("HOOP_RENDEZVOUS", "MASTER_ADDR"):
            if key not in env:
                continue
            host, _, port = env[key].rpartition(":") if key == "HOOP_RENDEZVOUS" else (env[key], "", "")
            if host not in host0_names:
                fail("%s=%s in pod %s does not name the pod that hosts the rendezvous (%s)"
                     % (key, env[key], pod["name"], " or ".join(sorted(host0_names))))
            if key == "HOOP_RENDEZVOUS":
                new_port.setdefault(port, free_port())
                env[key] = "127.0.0.1:%d" % new_port[port]
            else:
                env[key] = "127.0.0.1"
        if port_key in env:
            new_port.setdefault("master", free_port(pair=True))
            env[port_key] = str(new_port["master"])
        env.setdefault("HOOP_HOSTNAME", pod["hostname"])
        for path, local in pod["mounts"].items():
            for key, value in env.items():
                if value.startswith(path.rstrip("/") + "/"):
                    env[key] = local + value[len(path.rstrip("/")):]
        argv = []
        for i, word in enumerate(pod["argv"]):
            if i == 0 and word == "sgd":
                word = os.path.join(opts.build, "examples", "sgd", "sgd")
            elif i == 0 and word in ("python3", "python"):
                word = "/usr/bin/python3"
            word = word.replace("/opt/hoop/", opts.src.rstrip("/") + "/")
            argv.append(word)
        pod["argv"] = argv + shlex.split(opts.extra_args)
    return new_port


def indexed_job(docs):
    jobs = [d for d in docs if d["kind"] == "Job"]
    services = [d for d in docs if d["kind"] == "Service"]
    if len(jobs) != 1 or len(services) != 1:
        fail("expected one Job and one Service")
    job, service = jobs[0], services[0]
    spec, name = job["spec"], job["metadata"]["name"]
    if spec.get("completionMode") != "Indexed":
        fail("the Job is not Indexed: its pods get no JOB_COMPLETION_INDEX")
    template = spec["template"]
    subdomain = template["spec"].get("subdomain")
    if subdomain != service["metadata"]["name"]:
        fail("the pods' subdomain %r is not the Service's name %r: they get no DNS names"
             % (subdomain, service["metadata"]["name"]))
    if service["spec"].get("clusterIP") != "None":
        fail("the Service is not headless (clusterIP: None): pod names do not resolve")
    if service["spec"].get("selector", {}).get("job-name") != name:
        fail("the Service does not select the Job's pods (selector job-name: %s)" % name)
    n = int(spec["completions"])
    if int(spec.get("parallelism", 1)) < n:
        fail("parallelism %s < completions %d: the ranks would not all run at once"
             % (spec.get("parallelism"), n))
    container = template["spec"]["containers"][0]
    pods = []
    for index in range(n):
        pod = {"name": "%s-%d-x7k2p" % (name, index), "hostname": "%s-%d" % (name, index),
               "index": index}
        pod["env"] = pod_env(container, pod, {"JOB_COMPLETION_INDEX": str(index)})
        pod["mounts"] = mounts(template, container)
        pod["argv"] = list(container.get("command", [])) + list(container.get("args", []))
        pods.append(pod)
    size = pods[0]["env"].get("HOOP_SIZE")
    if size != str(n):
        fail("HOOP_SIZE=%s, but the Job has %d completions" % (size, n))
    host0 = {"%s-0.%s" % (name, subdomain), "%s-0.%s.default.svc.cluster.local" % (name, subdomain),
             "%s-0.%s.default.svc" % (name, subdomain)}
    return pods, host0, None


def pytorchjob(docs):
    job = docs[0]
    name = job["metadata"]["name"]
    specs = job["spec"]["pytorchReplicaSpecs"]
    master = specs["Master"]
    if int(master.get("replicas", 1)) != 1:
        fail("a PyTorchJob has one master")
    workers = specs.get("Worker", {"replicas": 0})
    size = 1 + int(workers.get("replicas", 0))
    mcontainer = master["template"]["spec"]["containers"][0]
    port = 23456
    for p in mcontainer.get("ports", []):
        if p.get("name") == "pytorchjob-port":
            port = int(p["containerPort"])
    pods = []
    for role, spec, count in (("master", master, 1), ("worker", workers, size - 1)):
        for i in range(count):
            container = spec["template"]["spec"]["containers"][0]
            if container.get("name") != "pytorch":
                fail("the %s's container is named %r; the operator sets its variables only in "
                     "the one named pytorch" % (role, container.get("name")))
            rank = 0 if role == "master" else 1 + i
            pod = {"name": "%s-%s-%d" % (name, role, i), "hostname": "%s-%s-%d" % (name, role, i)}
            added = {"MASTER_ADDR": "%s-master-0" % name, "MASTER_PORT": str(port),
                     "WORLD_SIZE": str(size), "RANK": str(rank), "PYTHONUNBUFFERED": "1"}
            pod["env"] = pod_env(container, pod, added)
            pod["mounts"] = mounts(spec["template"], container)
            pod["argv"] = list(container.get("command", [])) + list(container.get("args", []))
            pods.append(pod)
    return pods, {"%s-master-0" % name}, "MASTER_PORT"


docs = [d for d in yaml.safe_load_all(open(opts.manifest)) if d]
kinds = {d["kind"] for d in docs}
if "PyTorchJob" in kinds:
    pods, host0, port_key = pytorchjob(docs)
elif "Job" in kinds:
    pods, host0, port_key = indexed_job(docs)
else:
    fail("neither an indexed Job nor a PyTorchJob")
localize(pods, host0, port_key or "")

base = dict(os.environ)
for key in list(base):
    if key.startswith(("HOOP_", "SLURM_", "OMPI_", "PMIX_")) or key in (
            "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "JOB_COMPLETION_INDEX"):
        del base[key]
base["PYTHONPATH"] = os.path.join(opts.src, "python")
base["HOOP_LIBRARY"] = os.path.join(opts.build, "lib", ".libs", "libhoop.so.1")
print("%s: %d pods" % (os.path.basename(opts.manifest), len(pods)))
for pod in pods:
    shown = {k: v for k, v in pod["env"].items() if k != "PYTHONUNBUFFERED"}
    print("  %s: %s" % (pod["hostname"], " ".join("%s=%s" % kv for kv in sorted(shown.items()))))
print("  command: %s" % " ".join(pods[0]["argv"]))
procs = []
for pod in pods:
    env = dict(base)
    env.update(pod["env"])
    env["HOOP_DEBUG"] = "info"  # each rank's "joined job ... as rank R of N", checked below
    out = open(os.path.join(work, pod["hostname"] + ".out"), "w+")
    procs.append((pod, out, subprocess.Popen(pod["argv"], env=env, stdout=out,
                                             stderr=subprocess.STDOUT)))
bad = []
for pod, out, proc in procs:
    try:
        rc = proc.wait(timeout=opts.timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = "timeout"
    out.seek(0)
    pod["output"] = out.read()
    if rc != 0:
        bad.append("%s exited %s:\n%s" % (pod["hostname"], rc, pod["output"][-2000:]))
for pod, _, proc in procs:
    if proc.poll() is None:
        proc.kill()
if bad:
    fail("\n".join(bad))
# Every pod exiting 0 is not enough: n pods that each ran a job of its own would too. They must
# have formed one job of n ranks, each pod a different rank.
joined = []
for pod in pods:
    m = re.search(r"joined job '([^']*)' as rank (\d+) of (\d+)", pod["output"])
    if not m:
        fail("%s never said it joined a job:\n%s" % (pod["hostname"], pod["output"][-2000:]))
    joined.append((m.group(1), int(m.group(2)), int(m.group(3))))
if len({j[0] for j in joined}) != 1 or {j[2] for j in joined} != {len(pods)} or \
        sorted(j[1] for j in joined) != list(range(len(pods))):
    fail("the pods did not form one job of %d ranks: %s" % (
        len(pods), ", ".join("%s: job %s rank %d of %d" % ((p["hostname"],) + j)
                             for p, j in zip(pods, joined))))
print("  one job '%s' of %d ranks, each pod a rank" % (joined[0][0], len(pods)))
print("  %s's last lines:" % pods[0]["hostname"])
for line in pods[0]["output"].strip().splitlines()[-3:]:
    print("    " + line)
print("%s: every pod exited 0" % os.path.basename(opts.manifest))
