/* state.c - the memory kinds' state of a communicator: made with it, freed last. */
#include <stdlib.h>

#include "mem/kind.h"
#include "mem/state.h"

hoop__mem_state *hoop__mem_state_new(void) {
  return calloc(1, sizeof(hoop__mem_state));
}

void hoop__mem_state_free(hoop_comm *comm) {
  free(comm->mem_state);
  comm->mem_state = NULL;
}

size_t hoop__mem_device_regs(const hoop_comm *comm) {
  return hoop__net((hoop_comm *)comm)->mem_state->device_regs;
}
