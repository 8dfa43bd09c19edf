#!/usr/bin/env python3
"""make-digits-idx.py - turn scikit-learn's 8x8 handwritten digits (1797 images, shipped by Debian's
python3-sklearn as digits.csv.gz) into MNIST's IDX files, so that examples/sgd/sgd can train on real
images without a download. Uses the standard library only; scikit-learn itself is not imported.

    apt-get install -y python3-sklearn    # or: apt-get download python3-sklearn && dpkg-deb -x ...
    examples/sgd/make-digits-idx.py /tmp/digits
    hooprun -np 4 examples/sgd/sgd --train-images /tmp/digits/train-images-idx3-ubyte \\
        --train-labels /tmp/digits/train-labels-idx1-ubyte \\
        --test-images /tmp/digits/test-images-idx3-ubyte --test-labels /tmp/digits/test-labels-idx1-ubyte

Each CSV row holds 64 pixels from 0 to 16 and the label. Pixels are scaled to 0..255 as in MNIST.
The first 1500 rows become the training set and the remaining 297 the test set (the rows come in
the order of the people who wrote them, so the test digits are partly by unseen writers).
"""
import argparse
import gzip
import os
import struct

DEFAULT_CSV = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz"
TRAIN_COUNT = 1500


def write_idx(path, dims, data):
    """An IDX file of unsigned bytes: magic 0, 0, 0x08, len(dims); big-endian dims; the bytes."""
    with open(path, "wb") as out:
        out.write(struct.pack(">BBBB", 0, 0, 0x08, len(dims)))
        out.write(struct.pack(">%dI" % len(dims), *dims))
        out.write(bytes(data))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir", help="folder for the four IDX files")
    parser.add_argument("--csv", default=DEFAULT_CSV, help="digits.csv.gz (default: %(default)s)")
    args = parser.parse_args()

    images, labels = [], []
    with gzip.open(args.csv, "rt") as rows:
        for row in rows:
            values = [int(float(v)) for v in row.split(",")]
            if len(values) != 65 or not all(0 <= v <= 16 for v in values[:64]):
                raise SystemExit("%s: unexpected row %r" % (args.csv, row[:60]))
            images.append([(v * 255 + 8) // 16 for v in values[:64]])
            labels.append(values[64])

    os.makedirs(args.outdir, exist_ok=True)
    for name, first, end in (("train", 0, TRAIN_COUNT), ("test", TRAIN_COUNT, len(images))):
        count = end - first
        pixels = [p for image in images[first:end] for p in image]
        write_idx(os.path.join(args.outdir, name + "-images-idx3-ubyte"), (count, 8, 8), pixels)
        write_idx(os.path.join(args.outdir, name + "-labels-idx1-ubyte"), (count,),
                  labels[first:end])
        print("%s: %d images" % (name, count))


if __name__ == "__main__":
    main()
