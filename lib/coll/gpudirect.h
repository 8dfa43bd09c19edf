/* gpudirect.h - collectives on registered device buffers straight between the GPUs and the verbs
 * transport, GPUDirect RDMA (gpudirect.c). */
#ifndef HOOP__COLL_GPUDIRECT_H
#define HOOP__COLL_GPUDIRECT_H

#include "coll/coll.h"

/* Run the call with algo on the device buffers themselves if every rank can (1, its result in
 * *result: a failed exchange counts too), or settle alike on every rank that it is staged (0).
 * prepare is the collective's step before its algorithm (NULL: none). The dispatcher calls it
 * after CUDA IPC declined the call, before staging. */
int hoop__gdr_run(hoop_comm *comm, const hoop__coll_args *args, hoop__algo_fn algo,
                  hoop_result (*prepare)(hoop_comm *comm, const hoop__coll_args *args),
                  hoop_result *result);

/* Free the device scratch and the state (hoop_finalize, after the registrations are released). */
void hoop__gdr_free(hoop_comm *comm);

#endif /* HOOP__COLL_GPUDIRECT_H */
