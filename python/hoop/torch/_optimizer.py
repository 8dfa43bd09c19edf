"""hoop.torch: DistributedOptimizer, which allreduces gradients in fixed buckets while backward
runs (_DistributedMixin is what it adds to the user's optimizer class)."""

import contextlib
import os
import warnings
import weakref

import torch

from .. import InvalidArgument, Unsupported
from . import _cycle, _job
from ._collectives import _checked, _scaled
from ._compression import Compression
from ._ops import Average, Sum, _op, global_process_set
from ._params import _check_same, _optimizer_entries
from ._sets import _process_set


def _bucket_bytes():
    text = os.environ.get("HOOP_BUCKET_BYTES", "")
    try:
        return max(1, int(text)) if text else 1 << 20
    except ValueError:
        raise InvalidArgument("HOOP_BUCKET_BYTES %r is not a number of bytes" % text,
                              InvalidArgument.code) from None


class _DistributedMixin:
    """What DistributedOptimizer adds to the user's optimizer class (see there)."""

    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor, groups, sparse_as_dense, process_set):
        super().__init__(params)
        call = "hvd.DistributedOptimizer"
        # The job's communicator, or a process set's, looked up at each use (_comm): after an
        # elastic reset the job's is the next generation's.
        self._process_set = process_set
        self._compression = compression
        self._sparse_as_dense = sparse_as_dense
        if op not in (Average, Sum):
            _op(None, op, call)  # Adasum and unknown ops say so
            raise InvalidArgument("%s: op must be hvd.Average or hvd.Sum, not %r" % (call, op),
                                  InvalidArgument.code)
        if gradient_predivide_factor != 1.0 and op != Average:
            raise ValueError("%s: gradient_predivide_factor needs op=hvd.Average" % call)
        if backward_passes_per_step < 1:
            raise ValueError("%s: backward_passes_per_step must be at least 1" % call)
        # Average with a predivide factor f: a sum of gradients divided by f, divided by size/f
        # after; otherwise hoop's own avg or sum.
        self._op = Sum if gradient_predivide_factor != 1.0 else op
        self._prescale = 1.0 / gradient_predivide_factor
        self._predivide = gradient_predivide_factor
        self._passes = backward_passes_per_step

        ordered = [p for group in self.param_groups for p in group["params"]]
        if named_parameters is not None:
            named = list(named_parameters)
            if any(not isinstance(item, tuple) for item in named):
                raise ValueError("%s: named_parameters should be (name, parameter) pairs, as "
                                 "model.named_parameters() gives" % call)
            names = [n for n, _ in named]
            if len(set(names)) < len(names):
                dup = sorted({n for n in names if names.count(n) > 1})
                raise ValueError("%s: parameter names in named_parameters must be unique; "
                                 "repeated: %s" % (call, ", ".join(dup)))
            self._names = {p: n for n, p in named}
            unnamed = [i for i, p in enumerate(ordered) if p not in self._names]
            if unnamed:
                raise ValueError("%s: named_parameters was given, but %d of the optimizer's "
                                 "parameters are not in it (the first is parameter %d)"
                                 % (call, len(unnamed), unnamed[0]))
        else:
            self._names = {p: "allreduce.noname.%d" % i for i, p in enumerate(ordered)}
        # Every rank's parameters alike, but on a newcomer to an elastic job before its first
        # sync: the members are in that sync (whose broadcast_parameters checks the model against
        # rank 0's), and a check here would meet it (Horovod's own elastic example makes its
        # DistributedOptimizer before hvd.elastic.run's function).
        if not _job.newcomer_unsynced:
            _check_same(_optimizer_entries(self, self._names), self._comm, call)

        self._params = [p for p in ordered if p.requires_grad]
        self._buckets = self._make_buckets(groups, call)
        self._bucket_of = {p: b for b, bucket in enumerate(self._buckets) for p in bucket}
        # Each bucket's calls carry a name (Horovod's "allreduce.<parameter>", here the bucket's
        # first parameter and how many more it holds) into their fingerprint: ranks that post
        # buckets in another order (two optimizers stepped in another order) fail naming both
        # instead of adding one bucket to another of the same shape.
        self._bucket_names = [
            "allreduce.%s" % self._names[b[0]] + ("+%d" % (len(b) - 1) if len(b) > 1 else "")
            for b in self._buckets]
        self._hooks = []
        self._flats = {}  # bucket: (communicator, packed buffer, registration) for a wire format
        self._reset()
        self._should_synchronize = True
        self._synchronized = False
        self._register_hooks()  # idle while the job has one rank (it may grow)

    @property
    def _comm(self):
        return _process_set(self._process_set, "hvd.DistributedOptimizer")

    @property
    def _postscale(self):
        return self._predivide / self._comm.size if self._predivide != 1.0 else 1.0

    def _make_buckets(self, groups, call):
        """Fixed buckets, the same on every rank: parameters in the reverse of their order (as
        backward produces gradients), cut at HOOP_BUCKET_BYTES (default 1 MiB) of what travels
        and wherever the dtype changes; or the user's groups (Horovod's groups argument)."""
        params = self._params
        wire = {p: self._compression.compress(torch.empty(0, dtype=p.dtype))[0].dtype
                for p in params}
        if groups is None or groups == 0:
            cap, buckets, used = _bucket_bytes(), [], 0
            for p in reversed(params):
                nbytes = p.numel() * torch.empty(0, dtype=wire[p]).element_size()
                if not buckets or used + nbytes > cap or wire[buckets[-1][-1]] != wire[p]:
                    buckets.append([])
                    used = 0
                buckets[-1].append(p)
                used += nbytes
            return buckets
        if isinstance(groups, int):
            if groups < 0:
                raise ValueError("%s: groups must be a positive number or a list" % call)
            per = -(-len(params) // groups)
            chunks = [params[i:i + per] for i in range(0, len(params), per)]
        else:
            chunks = [list(g) for g in groups]
            listed = {p for g in chunks for p in g}
            if any(p not in set(params) for p in listed):
                raise ValueError("%s: groups name a parameter the optimizer does not hold" % call)
            chunks += [[p] for p in params if p not in listed]
        buckets = []
        for chunk in chunks:  # a group holding several dtypes travels as one bucket per dtype
            for dtype in sorted({wire[p] for p in chunk}, key=str):
                buckets.append([p for p in chunk if wire[p] == dtype])
        return [b for b in buckets if b]

    def _register_hooks(self):
        for p in self._params:
            # The hook of the gradient accumulator runs once the gradient has been added to
            # p.grad (torch 1.x and 2.x alike).
            accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
            accumulator.register_hook(self._make_hook(p))
            self._hooks.append(accumulator)

    def _make_hook(self, p):
        def hook(*ignored):
            if self._comm.size == 1:
                return  # nothing to average (synchronize returns at once)
            if self._delay[p] <= 0:
                raise AssertionError(
                    "Gradients were computed more than backward_passes_per_step times before "
                    "call to step(). Increase backward_passes_per_step to accumulate gradients "
                    "locally.")
            self._delay[p] -= 1
            if self._delay[p] == 0:
                b = self._bucket_of[p]
                self._ready[b] += 1
                self._post_ready()
        return hook

    def _reset(self):
        self._delay = {p: self._passes for p in self._params}
        self._ready = [0] * len(self._buckets)
        self._next = 0  # buckets go out in their order, so that every rank's calls match
        self._inflight = []

    def _post_ready(self):
        while (self._next < len(self._buckets)
               and self._ready[self._next] == len(self._buckets[self._next])):
            self._post(self._next)

    def _post(self, b, join_flag=0.0):
        # Each bucket's place among the job's calls, for join() (_cycle.py): a call that backward
        # makes between two buckets (a model-parallel layer's) is repeated between them too.
        _cycle.record("bucket", weakref.ref(self), b)
        grads, ctxs = [], []
        for p in self._buckets[b]:
            if p.grad is None:  # a parameter this pass did not reach counts as zeros
                p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
            elif p.grad.is_sparse:
                if not self._sparse_as_dense:
                    raise Unsupported("hvd.DistributedOptimizer: %s has a sparse gradient; pass "
                                      "sparse_as_dense=True" % self._names[p], Unsupported.code)
                p.grad = p.grad.to_dense()
            elif not p.grad.is_contiguous():
                p.grad = p.grad.contiguous()
            _checked(p.grad, "hvd.DistributedOptimizer")
            wire, ctx = self._compression.compress(p.grad)
            if wire is p.grad:
                _scaled(wire, self._prescale)
            elif self._prescale != 1.0:
                wire.mul_(self._prescale)
            grads.append(wire)
            ctxs.append(ctx)
        last = b == len(self._buckets) - 1
        flag = torch.full((1,), join_flag, dtype=grads[0].dtype) if last else None
        wire = getattr(self._compression, "wire_format", None)
        if wire:
            # A wire format between hosts: the bucket packed into a buffer of its own, registered,
            # where error feedback keeps what compression dropped, element by element; the join
            # count travels exact beside it.
            flat = self._flat(b, grads)
            torch.cat([g.reshape(-1) for g in grads], out=flat)
            name = self._bucket_names[b]
            requests = [self._comm.iallreduce(flat, op=self._op, compress=wire + "+feedback",
                                              name=name)]
            if last:
                requests.append(self._comm.iallreduce(flag, op=self._op, name=name + ".joined"))
            self._inflight.append((b, requests, grads, ctxs, flat))
        else:
            # One more element rides with the last bucket: how many ranks have joined (join()).
            requests = [self._comm.iallreduce_many(grads + ([flag] if last else []), op=self._op,
                                                   name=self._bucket_names[b])]
            self._inflight.append((b, requests, grads, ctxs, None))
        self._next = b + 1
        return flag

    def _flat(self, b, grads):
        """Bucket b's packed buffer for a wire format, registered with the communicator that
        allreduces it (made anew after an elastic reset)."""
        comm, numel = self._comm, sum(g.numel() for g in grads)
        held = self._flats.get(b)
        if held is None or held[0] is not comm or held[1].numel() != numel:
            flat = torch.empty(numel, dtype=grads[0].dtype, device=grads[0].device)
            held = (comm, flat, comm.register(flat))
            self._flats[b] = held
        return held[1]

    def synchronize(self):
        """Finish every gradient's allreduce (starting those whose hook never ran, as zeros if
        the parameter has no gradient), leaving the averaged gradients in p.grad."""
        if self._comm.size == 1:
            self._synchronized = True
            return
        while self._next < len(self._buckets):
            self._post(self._next)
        try:
            for b, requests, grads, ctxs, flat in self._inflight:
                for request in requests:
                    request.wait()
                if flat is not None:
                    _unpack(flat, grads)
                for p, wire, ctx in zip(self._buckets[b], grads, ctxs):
                    if wire is p.grad:
                        _scaled(wire, self._postscale)
                    else:
                        out = self._compression.decompress(wire, ctx)
                        p.grad.copy_(out if self._postscale == 1.0 else out * self._postscale)
        finally:
            self._reset()
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """step() without synchronizing again, after an explicit synchronize() (for clipping)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "context after optimizer.synchronize(): the gradients are "
                              "allreduced again")
            self.synchronize()
        self._synchronized = False
        return super().step(closure)

    def zero_grad(self, *args, **kwargs):
        if self._inflight or any(d != self._passes for d in self._delay.values()):
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize(). This is "
                                 "prohibited as it can cause a race condition.")
        return super().zero_grad(*args, **kwargs)

    def _join_bucket(self, b):
        """Bucket b of a step with zero gradients, as a rank that joined posts it; after the last
        one, the step's end: how many ranks have joined (None before)."""
        if b == 0:
            for p in self._params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
                else:
                    p.grad.zero_()
            self._reset()
        flag = self._post(b, join_flag=1.0)
        if flag is None:
            return None
        for _, requests, _, _, _ in self._inflight:
            for request in requests:
                request.wait()
        self._reset()
        value = float(flag.float().item())
        return int(round(value * self._comm.size if self._op == Average else value))


def _unpack(flat, grads):
    at = 0
    for g in grads:
        g.copy_(flat[at:at + g.numel()].view_as(g))
        at += g.numel()


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set):
    """Wrap optimizer so that step() applies gradients averaged over every rank (Horovod's
    semantics): a hook on each parameter starts its bucket's allreduce (non-blocking, through hoop)
    as soon as backward has produced the bucket's last gradient, while backward goes on; step()
    waits for them, then steps. Buckets are fixed and go out in one order on every rank, so no
    coordinator is needed; each carries a name ("allreduce.<its first parameter>+<how many
    more>", from named_parameters), so that ranks posting buckets in another order (two
    optimizers stepped in another order) fail naming both rather than adding unrelated gradients.
    Without named_parameters the names are "allreduce.noname.<index>", which two optimizers share
    (as in Horovod). The result is an instance of the optimizer's own class."""
    call = "hvd.DistributedOptimizer"
    _process_set(process_set, call)  # refused at once where it would be at each step
    if groups is None and num_groups:
        groups = num_groups
    base = optimizer.__class__
    cls = type(base.__name__, (_DistributedMixin, base), {"__module__": base.__module__})
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
               op, gradient_predivide_factor, groups, sparse_as_dense, process_set)
