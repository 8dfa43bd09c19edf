"""hoop.torch: Horovod's elastic training (hvd.elastic) over hoop's shrink and grow.

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for state.batch in range(state.batch, batches):
                ...one step...
                state.commit()
            state.batch = 0

    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)
    train(state)

When a rank is lost (hooprun --min-np keeps the job going), every survivor's hoop call raises; run
restores the state to its last commit, makes the survivors a new communicator (hoop_comm_shrink),
brings every rank to rank 0's state (sync) and calls the function again. When newcomers wait to
join (hooprun --max-np starts replacements), commit raises HostsUpdatedInterrupt on every rank at
once; run then takes them in (hoop_comm_grow) and syncs them from rank 0's committed state.
"""

import copy
import functools

import torch

from .. import Aborted, Failed, HoopError, PeerLost, ProtocolError, Timeout
from . import _cycle, _handles, _job
from . import _plain
from ._params import broadcast_optimizer_state, broadcast_parameters
from ._sampler import ElasticSampler

# What a lost or stopped rank makes a call raise: the job goes on without it.
_JOB_FAILURES = (PeerLost, Timeout, Aborted, Failed, ProtocolError)


class HostsUpdatedInterrupt(RuntimeError):
    """Raised by State.commit on every rank when newcomers wait to join."""


class State:
    """What run saves at each commit and brings back after a failure."""

    def __init__(self):
        self._reset_callbacks = []

    def register_reset_callbacks(self, callbacks):
        """Functions to call after each reset (the job's size has changed)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        for callback in self._reset_callbacks:
            callback()

    def commit(self):
        """Save the state, then look for newcomers (every rank alike)."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        comm = _job._live("hvd.elastic.State.commit")
        waiting = torch.tensor([comm.newcomers()], dtype=torch.int64)
        comm.allreduce(waiting, op="max")  # alike on every rank, or some would grow alone
        if waiting.item() > 0:
            raise HostsUpdatedInterrupt("%d newcomers wait to join" % waiting.item())

    def save(self):
        raise NotImplementedError

    def restore(self):
        raise NotImplementedError

    def sync(self):
        raise NotImplementedError


class ObjectState(State):
    """Plain attributes (epoch=0, batch=0, ...), saved by copy and synced from rank 0. They travel
    without pickle, so they may be None, bool, int, float, str, bytes, tensors and lists, tuples
    and dicts of them (else TypeError naming the call); for other objects, broadcast them with
    hvd.broadcast_object, which trusts rank 0 to send no code."""

    def __init__(self, **kwargs):
        super().__init__()
        self._known = sorted(kwargs)
        for name, value in kwargs.items():
            setattr(self, name, value)
        self._saved = {}
        self.save()

    def save(self):
        self._saved = {name: copy.deepcopy(getattr(self, name)) for name in self._known}

    def restore(self):
        for name, value in self._saved.items():
            setattr(self, name, copy.deepcopy(value))

    def sync(self):
        comm = _job._live("hvd.elastic.ObjectState.sync")
        values = _plain.broadcast({name: getattr(self, name) for name in self._known}, 0, comm,
                                  "hvd.elastic.ObjectState.sync")
        for name, value in values.items():
            setattr(self, name, value)
        self.save()


class TorchState(ObjectState):
    """A model's parameters and an optimizer's state, with plain attributes (kwargs) and
    ElasticSamplers (kwargs too: saved, restored and synced by their state_dict). A
    DistributedOptimizer in it follows the job's communicator through resets (as it does
    anywhere), its gradients' calls on the old one dropped."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        self.model, self.optimizer = model, optimizer
        self._model_saved = self._optimizer_saved = None
        self._samplers = {k: v for k, v in kwargs.items() if isinstance(v, ElasticSampler)}
        self._samplers_saved = {}
        for name, sampler in self._samplers.items():
            setattr(self, name, sampler)
        super().__init__(**{k: v for k, v in kwargs.items() if k not in self._samplers})

    def save(self):
        if self.model is not None:
            self._model_saved = copy.deepcopy(self.model.state_dict())
        if self.optimizer is not None:
            self._optimizer_saved = copy.deepcopy(self.optimizer.state_dict())
        self._samplers_saved = {k: s.state_dict() for k, s in self._samplers.items()}
        super().save()

    def restore(self):
        if self.model is not None and self._model_saved is not None:
            self.model.load_state_dict(self._model_saved)
        if self.optimizer is not None and self._optimizer_saved is not None:
            self.optimizer.load_state_dict(self._optimizer_saved)
        for name, saved in self._samplers_saved.items():
            self._samplers[name].load_state_dict(saved)
        super().restore()

    def sync(self):
        if hasattr(self.optimizer, "_reset") and hasattr(self.optimizer, "_inflight"):
            self.optimizer._reset()  # a DistributedOptimizer: no call of the old communicator
        if self.model is not None:
            broadcast_parameters(self.model.state_dict(), root_rank=0)
        if self.optimizer is not None:
            broadcast_optimizer_state(self.optimizer, root_rank=0)
        comm = _job._live("hvd.elastic.TorchState.sync")
        for name in sorted(self._samplers):
            self._samplers[name]._sync(comm, "hvd.elastic.TorchState.sync")
        super().sync()


def _reset(grow):
    """The job's communicator replaced by its next generation: the survivors (shrink) or the
    members and the newcomers (grow). Process sets and outstanding handles go with the old one."""
    import hoop  # its shared communicator (the backend's too) becomes the new one
    from ._sets import _forget_all
    old = _job._live("hvd.elastic.run")
    _handles._handles.clear()
    _forget_all()
    _cycle.clear()
    new = old.grow() if grow else old.shrink()
    try:
        old.finalize()
    except HoopError:
        pass
    _job._comm = new
    hoop._shared = new
    return new


def run(func):
    """Run func(state, ...) until it returns, going on after lost ranks and taking in newcomers
    (see the module's description)."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        reset = None
        while True:
            if reset is not None:
                _reset(grow=reset == "grow")
                state.on_reset()
                reset = None
            state.sync()
            _job.newcomer_unsynced = False
            try:
                return func(state, *args, **kwargs)
            except HostsUpdatedInterrupt:
                reset = "grow"  # committed just now: nothing to restore
            except _JOB_FAILURES:
                state.restore()
                reset = "shrink"
    return wrapper


__all__ = ["run", "State", "ObjectState", "TorchState", "HostsUpdatedInterrupt",
           "ElasticSampler"]
