"""The hoop backend's group options (pg_options) and what ends a group (_backend): a group's
Options, the stand-in for an ended group's communicator, and destroy_process_group made to shut
hoop's groups down on every torch."""

import torch.distributed as dist

from .. import Failed
from .._settings import _encrypt_value


class Options:
    """The hoop backend's pg_options, as NCCL's are ProcessGroupNCCL.Options:
    dist.init_process_group("hoop", pg_options=ProcessGroupHoop.Options(reproducible=True)), or
    new_group(..., pg_options=...). reproducible: True or False sets the group's reproducible mode
    (hoop(3), "Reproducible reductions"), alike on every member; None leaves it to
    HOOP_REPRODUCIBLE and torch.use_deterministic_algorithms. compress: the group's wire format
    between hosts ("int8", "bf16+feedback"...; hoop(3), "Slow links"); None leaves it to
    HOOP_COMPRESS. encrypt: True, False or a cipher's name seals the job's TCP connections
    (HOOP_ENCRYPT in hoop-env(7)): they are the job's, made when it is joined, so only the first
    group of a process that has not joined yet can choose; later it must say what the job has."""

    def __init__(self, reproducible=None, compress=None, encrypt=None):
        self.reproducible = reproducible
        self.compress = compress
        self.encrypt = encrypt

    def __repr__(self):
        return "ProcessGroupHoop.Options(reproducible=%r, compress=%r, encrypt=%r)" % (
            self.reproducible, self.compress, self.encrypt)


def _read_options(options):
    """options' (reproducible, compress, encrypt) settings (None where it sets none), or
    TypeError naming what it got."""
    if options is None:
        return None, None, None
    if isinstance(options, dict):
        unknown = sorted(set(options) - {"reproducible", "compress", "encrypt"})
        if unknown:
            raise TypeError("hoop backend: pg_options has no %s (it takes reproducible, "
                            "compress and encrypt)" % ", ".join(map(str, unknown)))
        on, compress = options.get("reproducible"), options.get("compress")
        encrypt = options.get("encrypt")
    elif isinstance(options, Options):
        on, compress, encrypt = options.reproducible, options.compress, options.encrypt
    else:
        raise TypeError("hoop backend: pg_options must be a ProcessGroupHoop.Options (or a dict "
                        "of its fields), not %s" % type(options).__name__)
    if on is not None and not isinstance(on, bool):
        raise TypeError("hoop backend: pg_options' reproducible must be True, False or None, "
                        "not %r" % (on,))
    if compress is not None and not isinstance(compress, str):
        raise TypeError("hoop backend: pg_options' compress must be a format name such as "
                        "'int8', or None, not %r" % (compress,))
    return on, compress, None if encrypt is None else _encrypt_value(encrypt)


class _Ended:
    """What stands for the communicator of a group that was shut down or aborted: every call on
    the group raises, naming the call and what ended the group."""

    def __init__(self, how):
        self._how = how

    def __getattr__(self, name):
        raise Failed("hoop backend: %s on a process group that was %s; make a new group"
                     % (name.lstrip("i"), self._how), Failed.code)


def _mapped_groups():
    """The process groups torch.distributed knows of now (1.13: _pg_map; 2.x: _world.pg_map)."""
    c10d = dist.distributed_c10d
    world = getattr(c10d, "_world", None)
    mapped = getattr(world, "pg_map", None) if world is not None else None
    return list(mapped if mapped is not None else getattr(c10d, "_pg_map", {}))


def _wrap_destroy(destroy, kind):
    """destroy_process_group, then shutdown() of each hoop group it dropped (new groups first, the
    default last): torch before 2.9 calls no method of a group it destroys. Only the names bound
    after this import see the wrapper (a `from torch.distributed import destroy_process_group`
    made earlier keeps torch's own, whose new groups then keep their communicators until exit)."""
    import functools

    @functools.wraps(destroy)
    def destroy_process_group(group=None):
        before = [pg for pg in _mapped_groups() if isinstance(pg, kind)]
        destroy(group)
        still = set(map(id, _mapped_groups()))
        for pg in sorted((pg for pg in before if id(pg) not in still),
                         key=lambda pg: not pg._owns_comm):
            pg.shutdown()
    destroy_process_group._hoop_wrapped = True
    return destroy_process_group
