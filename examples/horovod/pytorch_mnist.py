"""Horovod's PyTorch MNIST example, as Horovod publishes it, on hoop.

    examples/horovod/prepare-data.sh ./data     # Debian's Fashion-MNIST where torchvision looks
    hooprun -np 4 /usr/bin/python3 examples/horovod/pytorch_mnist.py --data-dir ./data

Written again here from its published behaviour (the same options, model, training and output),
changed in two places only: ``import hoop.torch as hvd`` where Horovod's is imported, and the data:
torchvision's FashionMNIST (from Debian's dataset-fashion-mnist, which prepare-data.sh lays out as
torchvision expects it: nothing is downloaded) where the original reads MNIST. Horovod's own
launcher options (--num-proc, --hosts, --communication: horovod.run) are left out; hooprun starts
the ranks. Each rank trains on its shard (DistributedSampler) with the learning rate scaled by the
number of ranks, DistributedOptimizer averages the gradients, rank 0's parameters and optimizer
state are broadcast first, and the test loss and accuracy are averaged over the ranks' shards.
"""

import argparse
import os

import torch
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed
from filelock import FileLock
from torchvision import datasets, transforms

import hoop.torch as hvd

parser = argparse.ArgumentParser(description="PyTorch MNIST Example")
parser.add_argument("--batch-size", type=int, default=64, metavar="N",
                    help="input batch size for training (default: 64)")
parser.add_argument("--test-batch-size", type=int, default=1000, metavar="N",
                    help="input batch size for testing (default: 1000)")
parser.add_argument("--epochs", type=int, default=10, metavar="N",
                    help="number of epochs to train (default: 10)")
parser.add_argument("--lr", type=float, default=0.01, metavar="LR",
                    help="learning rate (default: 0.01)")
parser.add_argument("--momentum", type=float, default=0.5, metavar="M",
                    help="SGD momentum (default: 0.5)")
parser.add_argument("--no-cuda", action="store_true", default=False,
                    help="disables CUDA training")
parser.add_argument("--seed", type=int, default=42, metavar="S",
                    help="random seed (default: 42)")
parser.add_argument("--log-interval", type=int, default=10, metavar="N",
                    help="how many batches to wait before logging training status")
parser.add_argument("--fp16-allreduce", action="store_true", default=False,
                    help="use fp16 compression during allreduce")
parser.add_argument("--use-mixed-precision", action="store_true", default=False,
                    help="use mixed precision for training")
parser.add_argument("--use-adasum", action="store_true", default=False,
                    help="use adasum algorithm to do reduction (hoop: refused, naming it)")
parser.add_argument("--gradient-predivide-factor", type=float, default=1.0,
                    help="apply gradient predivide factor in optimizer (default: 1.0)")
parser.add_argument("--data-dir",
                    help="where FashionMNIST/raw/ holds the data set (default: ./data)")


class Net(nn.Module):
    """Two convolutions, dropout, two fully connected layers: the example's model."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = F.relu(self.fc1(x.view(-1, 320)))
        x = F.dropout(x, training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)


def main(args):
    hvd.init()
    torch.manual_seed(args.seed)
    if args.cuda:
        torch.cuda.set_device(hvd.local_rank())  # one GPU per rank of the host
        torch.cuda.manual_seed(args.seed)
    elif args.use_mixed_precision:
        raise ValueError("Mixed precision is only supported with cuda enabled.")
    torch.set_num_threads(1)  # each rank one CPU thread

    kwargs = {"num_workers": 1, "pin_memory": True} if args.cuda else {}
    # Data-loader workers started by a fork server rather than fork where it exists (fork is
    # unsafe beside some InfiniBand stacks).
    if (kwargs.get("num_workers", 0) > 0 and getattr(mp, "_supports_context", False)
            and "forkserver" in mp.get_all_start_methods()):
        kwargs["multiprocessing_context"] = "forkserver"

    data_dir = args.data_dir or "./data"
    normalize = transforms.Compose([transforms.ToTensor(),
                                    transforms.Normalize((0.1307,), (0.3081,))])
    with FileLock(os.path.expanduser("~/.horovod_lock")):
        train_dataset = datasets.FashionMNIST(data_dir, train=True, download=True,
                                              transform=normalize)
    train_sampler = torch.utils.data.distributed.DistributedSampler(
        train_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size,
                                               sampler=train_sampler, **kwargs)
    test_dataset = datasets.FashionMNIST(data_dir, train=False, transform=normalize)
    test_sampler = torch.utils.data.distributed.DistributedSampler(
        test_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=args.test_batch_size,
                                              sampler=test_sampler, **kwargs)

    model = Net()
    lr_scaler = hvd.size() if not args.use_adasum else 1  # Adasum needs no larger rate
    if args.cuda:
        model.cuda()
        if args.use_adasum and hvd.nccl_built():
            lr_scaler = hvd.local_size()
    optimizer = optim.SGD(model.parameters(), lr=args.lr * lr_scaler, momentum=args.momentum)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression,
                                         op=hvd.Adasum if args.use_adasum else hvd.Average,
                                         gradient_predivide_factor=args.gradient_predivide_factor)
    scaler = torch.cuda.amp.GradScaler() if args.use_mixed_precision else None

    def log_step(epoch, batch_idx, data, loss, extra=""):
        # len(train_sampler): the examples of this rank's shard.
        print("Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}{}".format(
            epoch, batch_idx * len(data), len(train_sampler),
            100.0 * batch_idx / len(train_loader), loss.item(), extra))

    def train_epoch(epoch):
        model.train()
        train_sampler.set_epoch(epoch)  # another shuffle each epoch, the same on every rank
        for batch_idx, (data, target) in enumerate(train_loader):
            if args.cuda:
                data, target = data.cuda(), target.cuda()
            optimizer.zero_grad()
            if scaler is None:
                loss = F.nll_loss(model(data), target)
                loss.backward()
                optimizer.step()
            else:
                with torch.cuda.amp.autocast():
                    loss = F.nll_loss(model(data), target)
                scaler.scale(loss).backward()
                optimizer.synchronize()  # the averaged gradients, before unscaling them
                scaler.unscale_(optimizer)
                with optimizer.skip_synchronize():
                    scaler.step(optimizer)
                scaler.update()
            if batch_idx % args.log_interval == 0:
                log_step(epoch, batch_idx, data, loss,
                         "" if scaler is None else "\tLoss Scale: {}".format(scaler.get_scale()))

    def metric_average(value, name):
        return hvd.allreduce(torch.tensor(float(value)), name=name).item()

    def test():
        model.eval()
        test_loss, test_accuracy = 0.0, 0.0
        for data, target in test_loader:
            if args.cuda:
                data, target = data.cuda(), target.cuda()
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            pred = output.data.max(1, keepdim=True)[1]
            test_accuracy += pred.eq(target.data.view_as(pred)).cpu().float().sum()
        # Per example of this rank's shard, then averaged over the ranks.
        test_loss = metric_average(test_loss / len(test_sampler), "avg_loss")
        test_accuracy = metric_average(test_accuracy / len(test_sampler), "avg_accuracy")
        if hvd.rank() == 0:
            print("\nTest set: Average loss: {:.4f}, Accuracy: {:.2f}%\n".format(
                test_loss, 100.0 * test_accuracy))

    for epoch in range(1, args.epochs + 1):
        train_epoch(epoch)
        test()  # in full precision: testing costs little


if __name__ == "__main__":
    args = parser.parse_args()
    args.cuda = not args.no_cuda and torch.cuda.is_available()
    main(args)
