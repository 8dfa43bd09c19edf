#!/bin/sh
# The Kubernetes manifests of examples/k8s keep their contract with hoop_init_from_env: each pod's
# variables, set as Kubernetes (an indexed Job) or Kubeflow's operator (a PyTorchJob) would set
# them, form a job whose every rank exits 0 (tests/support/k8s_contract.py; no cluster runs here).
# Needs Debian's python3-yaml; the PyTorchJob also python3-torch and dataset-fashion-mnist.
set -eu
src=${HOOP_SRCDIR:-.}
build=${HOOP_BUILDDIR:-.}
py=/usr/bin/python3
$py -c 'import yaml' 2>/dev/null || { echo "SKIP: no python3-yaml (apt-get install python3-yaml)"; exit 77; }
check() {
  $py "$src/tests/support/k8s_contract.py" --build "$build" --src "$src" "$@"
}
check "$src/examples/k8s/indexed-job.yaml"
if [ "${HOOP_SANITIZED:-no}" = yes ]; then
  echo "SKIP-PART: pytorchjob.yaml: libhoop is built with the sanitizers, which $py cannot load"
elif $py -c 'import torch' 2>/dev/null && [ -d /usr/share/datasets/fashion-mnist ]; then
  check "$src/examples/k8s/pytorchjob.yaml" --extra-args "--steps 20"
else
  echo "SKIP-PART: pytorchjob.yaml: no python3-torch or dataset-fashion-mnist"
fi
