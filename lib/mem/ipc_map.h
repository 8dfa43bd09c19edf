/* ipc_map.h - peers' device buffers mapped into this process by CUDA IPC, cached for the process:
 * communicators of one job map the same peers' memory, and the driver maps an allocation once per
 * context. A call holds the mappings it reads until it is done with them; the least recently used
 * mapping no call holds is closed to make room. A mapping keeps the peer's allocation alive in the
 * driver after the peer frees it, until it is closed: mappings are closed when the peer's range
 * turns out to hold another allocation, when the cache is full, and for a communicator's peers at
 * its hoop_finalize or failure (hoop__ipc_map_forget). */
#ifndef HOOP__MEM_IPC_MAP_H
#define HOOP__MEM_IPC_MAP_H

#include <stddef.h>
#include <stdint.h>

#include "mem/cuda.h"

/* A random number of this process (never 0), drawn again in a child after fork: ranks that are
 * threads of one process share pointers instead of mapping them. */
uint64_t hoop__ipc_process(void);

/* The ranks that live in this process, by job (a key every rank of a job computes alike) and rank
 * in it: a descriptor that says it comes from this process is believed only from them, never from
 * its own word (a member that copies another's process number would have this rank read its own
 * memory at an address of the member's choosing). Counted: add as often as remove. */
void hoop__ipc_local_add(uint64_t job, int rank);
void hoop__ipc_local_remove(uint64_t job, int rank);
int hoop__ipc_local_has(uint64_t job, int rank);

/* The mappings one call holds. */
typedef struct hoop__ipc_held {
  struct hoop__ipc_mapping **held;
  int nheld, capacity;
} hoop__ipc_held;

/* Where the buffer process exported as from (its offset included) is readable in the context of
 * the device memory at near: a mapping from the cache or made now, held by holder; NULL with why.
 * peer names the exporter in messages. */
char *hoop__ipc_map(hoop__ipc_held *holder, int peer, uint64_t process,
                    const hoop__cuda_export *from, const void *near, char *why, size_t whylen);
/* The call is done with what holder holds: stale mappings no call holds any longer are closed. */
void hoop__ipc_map_release(hoop__ipc_held *holder);
/* Close (once no call holds them) the mappings of these processes' memory, so that what they free
 * is not kept alive here. */
void hoop__ipc_map_forget(const uint64_t *processes, int n);

#endif /* HOOP__MEM_IPC_MAP_H */
