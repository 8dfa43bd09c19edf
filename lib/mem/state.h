/* state.h - the memory kinds' state of a communicator (hoop_comm.mem_state), which only lib/mem
 * sees (lib/floors: "own"): the host copies of device buffers, the CUDA kind's call state and
 * piped stage, and the table of the user's registrations. The communicator's life makes and frees
 * it through mem/kind.h. */
#ifndef HOOP__MEM_STATE_H
#define HOOP__MEM_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "core/internal.h"

struct hoop__mem_state {
  hoop__host_buf stage; /* host copies of device buffers (stage.c), grown on demand */
  void *cuda_pipe;      /* the stream and events of the piped stage (cuda/pipe.c), or NULL */
  void *cuda_kind;      /* the CUDA memory kind's call state and device scratch (cuda/kind.c) */
  struct hoop__stage *stage_pipe; /* the call's pipelined stage while its algorithm runs */
  int pipeline_read;              /* HOOP_CUDA_PIPELINE_BYTES read into pipeline_bytes */
  size_t pipeline_bytes;
  /* hoop_register's entries, sorted by base address (register.c): net's, which its views share
   * (their transports are net's), read and changed under the net lock. */
  struct hoop__registration *regs;
  size_t reg_count, reg_capacity;
  uint64_t reg_last_handle; /* handles are never reused */
  size_t device_regs;       /* the user's registrations of device memory */
};

#endif
