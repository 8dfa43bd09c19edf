#!/bin/sh
# Lay Debian's Fashion-MNIST (apt-get install dataset-fashion-mnist) out where torchvision's
# FashionMNIST looks for it, DIR/FashionMNIST/raw/ (uncompressed IDX files), so that the examples
# here find it and download nothing. Usage: prepare-data.sh [DIR] (default ./data).
set -eu
dir=${1:-./data}/FashionMNIST/raw
src=${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
if [ ! -f "$src/train-images-idx3-ubyte.gz" ]; then
  echo "prepare-data.sh: no $src/train-images-idx3-ubyte.gz (apt-get install dataset-fashion-mnist)" >&2
  exit 1
fi
mkdir -p "$dir"
for name in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte \
  t10k-labels-idx1-ubyte; do
  if [ ! -s "$dir/$name" ]; then
    gunzip -c "$src/$name.gz" >"$dir/$name.part"
    mv -f "$dir/$name.part" "$dir/$name"
  fi
done
echo "$dir"
