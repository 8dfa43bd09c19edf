/* watch.h - a rank that hooprun started ends when hooprun does. hooprun tells its ranks who it is
 * (HOOP_LAUNCHER: pid, start time and boot id) and whether the rendezvous server is its own
 * (HOOP_LAUNCHER_RDZV=1); a thread of the rank then waits for the launcher's exit (a pidfd, on the
 * launcher's machine) and for its rendezvous connection to close (anywhere). When either comes,
 * the rank says so, aborts its communicator (so that its peers hear why) and sends itself SIGTERM,
 * then SIGKILL 3 s later, as hooprun would have. Jobs whose rendezvous is a hoopd are not tied to
 * it: a hoopd restart ends no job. */
#ifndef HOOP__CORE_WATCH_H
#define HOOP__CORE_WATCH_H

#include "core/internal.h"

/* What hooprun puts in HOOP_LAUNCHER for its ranks: "PID:START_TIME:BOOT_ID" of this process. */
void hoop__launcher_identity(char *out, size_t outlen);

/* After a successful hoop_init: start watching, if hooprun started this rank. */
void hoop__launcher_watch_start(hoop_comm *comm);
/* In hoop_finalize, before the rendezvous connection closes: stop watching. */
void hoop__launcher_watch_stop(hoop_comm *comm);

#endif /* HOOP__CORE_WATCH_H */
