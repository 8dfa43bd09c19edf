/* ipc.h - collectives on the device buffers of ranks sharing one host, by CUDA IPC (ipc.c). */
#ifndef HOOP__COLL_IPC_H
#define HOOP__COLL_IPC_H

#include "coll/coll.h"

/* Run the call by CUDA IPC if every rank can (1, its result in *result: an exchange failing
 * counts too), or settle alike on every rank that it goes the usual way (0). The dispatcher calls
 * it after choosing the algorithm, before staging. */
int hoop__ipc_run(hoop_comm *comm, const hoop__coll_args *args, hoop__algo_fn algo,
                  hoop_result *result);

/* Close the mappings and free the state (hoop_finalize). */
void hoop__ipc_free(hoop_comm *comm);

#endif /* HOOP__COLL_IPC_H */
