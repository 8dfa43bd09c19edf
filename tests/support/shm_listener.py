"""The abstract name of the shared-memory listener of the rank with a given pid, as
/proc/net/unix lists it ("hoop-shm-PID-..."), for the scripts that attack it."""


def listener_of(pid):
    """The name (without its leading NUL), or None when the process listens on none."""
    with open("/proc/net/unix") as table:
        for line in table:
            parts = line.split()
            if len(parts) >= 8 and parts[-1].startswith("@hoop-shm-%s-" % pid):
                return parts[-1][1:]
    return None
