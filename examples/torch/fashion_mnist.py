"""Fashion-MNIST from Debian's dataset-fashion-mnist, read straight from its gzip IDX files.

(torchvision's dataset class would try to download them.) Images come back as float32 tensors of
shape (n, 1, 28, 28), normalized with the training set's mean and deviation; labels as int64.
"""

import gzip
import os
import struct

import torch

DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"
CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
           "Bag", "Ankle boot")
MEAN, STD = 0.2860, 0.3530


def _idx(path, magic):
    with gzip.open(path, "rb") as f:
        data = f.read()
    got, = struct.unpack(">I", data[:4])
    if got != magic:
        raise ValueError("%s: not an IDX file of the expected kind (magic %#x, not %#x)"
                         % (path, got, magic))
    ndim = magic & 0xff
    dims = struct.unpack(">%dI" % ndim, data[4:4 + 4 * ndim])
    body = bytearray(data[4 + 4 * ndim:])
    count = 1
    for d in dims:
        count *= d
    if len(body) != count:
        raise ValueError("%s: %d bytes of data for dimensions %s" % (path, len(body), dims))
    return torch.frombuffer(body, dtype=torch.uint8).reshape(dims)


def load(split="train", directory=None):
    """(images, labels) of the "train" (60,000) or "test" (10,000) split."""
    directory = directory or os.environ.get("FASHION_MNIST_DIR", DEFAULT_DIR)
    prefix = {"train": "train", "test": "t10k"}[split]
    images = os.path.join(directory, "%s-images-idx3-ubyte.gz" % prefix)
    labels = os.path.join(directory, "%s-labels-idx1-ubyte.gz" % prefix)
    if not os.path.exists(images):
        raise FileNotFoundError("%s is missing: on Debian, apt-get install dataset-fashion-mnist "
                                "(or set FASHION_MNIST_DIR)" % images)
    x = _idx(images, 0x00000803).float().div_(255.0).sub_(MEAN).div_(STD).unsqueeze(1)
    y = _idx(labels, 0x00000801).long()
    return x, y


def model(hidden=256, linear=3):
    """The examples' classifier: a small MLP (no dropout, no batch norm: its result does not depend
    on how a global batch is split between ranks). linear: how many Linear layers (3 or more; each
    one past 3 is another hidden x hidden layer)."""
    if linear < 3:
        raise ValueError("the classifier has at least 3 Linear layers, not %d" % linear)
    layers = [torch.nn.Flatten(), torch.nn.Linear(28 * 28, hidden), torch.nn.ReLU()]
    for _ in range(linear - 3):
        layers += [torch.nn.Linear(hidden, hidden), torch.nn.ReLU()]
    layers += [torch.nn.Linear(hidden, hidden // 2), torch.nn.ReLU(), torch.nn.Linear(hidden // 2, 10)]
    return torch.nn.Sequential(*layers)
