/* register.c - hoop_register and hoop_deregister: the user names buffers it will reuse in many
 * collectives, and the transport prepares them once (the verbs transport registers them with the
 * device, so that collectives on them go zero-copy); the TCP transport keeps the bookkeeping only.
 *
 * Why explicit registration, as NCCL's ncclCommRegister, rather than a cache of whatever pointers
 * the collectives see: after free() or munmap() a later allocation may reuse the same virtual
 * addresses with other pages while a cached memory region still pins the old ones, and glibc's
 * free() unmaps without passing through an interposable munmap. An entry here lives exactly from
 * hoop_register to hoop_deregister (or hoop_finalize), which the user controls, so nothing stale
 * can be used. Handles are numbers never reused on a communicator, so a double deregister or a
 * made-up handle is caught instead of hitting another registration.
 */
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "core/log.h"
#include "mem/cuda.h"
#include "mem/state.h"
#include "transport/transport.h"

/* The entries are kept sorted by base address for the transport's lookups. */
static size_t insert_position(const hoop_comm *comm, const char *base) {
  size_t low = 0, high = comm->mem_state->reg_count;
  while (low < high) {
    size_t mid = low + (high - low) / 2;
    if ((const char *)comm->mem_state->regs[mid].base <= base)
      low = mid + 1;
    else
      high = mid;
  }
  return low;
}

const hoop__registration *hoop__registration_find(const hoop_comm *comm, const void *ptr,
                                                  size_t len) {
  comm = comm->net;
  const char *start = ptr;
  /* Entries may overlap: look back from the last one that starts at or below ptr. Few buffers
   * are registered at once, so the walk is short. */
  for (size_t i = insert_position(comm, start); i-- > 0;) {
    const hoop__registration *reg = &comm->mem_state->regs[i];
    const char *base = reg->base;
    if ((size_t)(start - base) <= reg->bytes && len <= reg->bytes - (size_t)(start - base))
      return reg;
  }
  return NULL;
}

/* One array of floats kept with a registration: in floats, or in device memory. */
struct hoop__kept {
  struct hoop__kept *next;
  const void *at;
  uint64_t key;
  size_t count;
  float *device; /* count floats of device memory beside the registration's (NULL: floats) */
  float floats[];
};

static void drop_kept(struct hoop__kept *kept) {
  hoop__cuda_free(kept->device);
  free(kept);
}

/* count zeroed floats of device memory in the context of near, or NULL. */
static float *device_floats(hoop_comm *comm, const void *near, size_t count) {
  enum { ZEROS = 1 << 20 };
  size_t bytes = count * sizeof(float);
  char *dev = hoop__cuda_alloc(bytes, near), *zeros = dev ? calloc(1, ZEROS) : NULL;
  hoop_result result = zeros ? HOOP_OK : HOOP_ERR_SYSTEM;
  for (size_t at = 0; at < bytes && result == HOOP_OK; at += ZEROS)
    result = hoop__mem_copy(comm, dev + at, zeros, bytes - at < ZEROS ? bytes - at : ZEROS);
  free(zeros);
  if (result != HOOP_OK) {
    hoop__cuda_free(dev);
    return NULL;
  }
  return (float *)(void *)dev;
}

/* What the transports made of reg, released. */
static void release_transport_mem(hoop_comm *comm, hoop__registration *reg) {
  for (int t = 0; t < hoop__transport_count(comm); t++) {
    hoop__tctx *ctx = hoop__transport_at(comm, t);
    if (reg->transport_mem[t] && ctx->ops->deregister_mem)
      ctx->ops->deregister_mem(ctx, reg->transport_mem[t]);
    reg->transport_mem[t] = NULL;
  }
}

/* Add [ptr, ptr + bytes) with handle (call_lock held): HOOP_OK, or the error recorded. */
/* Into net's table, for owner; under the net lock. */
static hoop_result add(hoop_comm *owner, void *ptr, size_t bytes, uint64_t handle) {
  hoop_comm *comm = hoop__net(owner);
  if (comm->mem_state->reg_count == comm->mem_state->reg_capacity) {
    size_t capacity = comm->mem_state->reg_capacity ? 2 * comm->mem_state->reg_capacity : 8;
    hoop__registration *grown = realloc(comm->mem_state->regs, capacity * sizeof *grown);
    if (!grown)
      return hoop__set_error(owner, HOOP_ERR_SYSTEM, "hoop_register: out of memory");
    comm->mem_state->regs = grown;
    comm->mem_state->reg_capacity = capacity;
  }
  hoop__registration reg = {.base = ptr, .bytes = bytes, .handle = handle, .owner = owner};
  hoop_result result = HOOP_OK;
  for (int t = 0; t < hoop__transport_count(comm) && result == HOOP_OK; t++) {
    hoop__tctx *ctx = hoop__transport_at(comm, t);
    if (ctx->ops->register_mem)
      result = ctx->ops->register_mem(ctx, ptr, bytes, &reg.transport_mem[t]);
  }
  if (result != HOOP_OK) {
    release_transport_mem(comm, &reg);
    if (owner != comm) /* the transports recorded it on net */
      memcpy(owner->last_error, comm->last_error, sizeof owner->last_error);
    return result;
  }
  reg.device = handle != 0 && hoop__mem_kind_of(ptr) == HOOP__MEM_DEVICE;
  comm->mem_state->device_regs += (size_t)reg.device;
  size_t at = insert_position(comm, ptr);
  memmove(&comm->mem_state->regs[at + 1], &comm->mem_state->regs[at],
          (comm->mem_state->reg_count - at) * sizeof *comm->mem_state->regs);
  comm->mem_state->regs[at] = reg;
  comm->mem_state->reg_count++;
  return HOOP_OK;
}

hoop_result hoop_register(hoop_comm *comm, void *ptr, size_t bytes, hoop_mem_handle *handle) {
  if (!comm)
    return HOOP_ERR_INVALID_ARG;
  if (!handle)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "hoop_register: handle is NULL");
  *handle = 0;
  if (!ptr)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "hoop_register: ptr is NULL");
  if (bytes == 0)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "hoop_register: bytes is 0");
  if ((uintptr_t)ptr > UINTPTR_MAX - bytes)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "hoop_register: %zu bytes at %p wrap around the address space", bytes,
                           ptr);
  hoop_comm *net = hoop__net(comm);
  hoop__lock_take(&comm->call_lock);
  hoop__net_enter(comm);
  hoop_result result = add(comm, ptr, bytes, net->mem_state->reg_last_handle + 1);
  if (result == HOOP_OK) {
    *handle = ++net->mem_state->reg_last_handle;
    HOOP__TRACE(HOOP_SUBSYS_NET, "hoop_register: %zu bytes at %p as handle %llu", bytes, ptr,
                (unsigned long long)*handle);
  }
  hoop__net_leave(comm);
  hoop__lock_release(&comm->call_lock);
  return result;
}

static void release(hoop_comm *comm, size_t index) {
  hoop__registration *reg = &comm->mem_state->regs[index];
  release_transport_mem(comm, reg);
  while (reg->kept) {
    struct hoop__kept *next = reg->kept->next;
    drop_kept(reg->kept);
    reg->kept = next;
  }
  comm->mem_state->device_regs -= (size_t)reg->device;
  memmove(reg, reg + 1, (comm->mem_state->reg_count - index - 1) * sizeof *reg);
  comm->mem_state->reg_count--;
}

hoop_result hoop_deregister(hoop_comm *comm, hoop_mem_handle handle) {
  if (!comm)
    return HOOP_ERR_INVALID_ARG;
  hoop_comm *net = hoop__net(comm);
  hoop__lock_take(&comm->call_lock);
  hoop__net_enter(comm);
  hoop_result result = HOOP_OK;
  size_t i = 0;
  while (i < net->mem_state->reg_count &&
         (net->mem_state->regs[i].handle != handle || net->mem_state->regs[i].owner != comm))
    i++;
  if (handle == 0 || i == net->mem_state->reg_count)
    result = hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                             "hoop_deregister: handle %llu is not registered on this "
                             "communicator (never returned by hoop_register, or already "
                             "deregistered)",
                             (unsigned long long)handle);
  else
    release(net, i);
  hoop__net_leave(comm);
  hoop__lock_release(&comm->call_lock);
  return result;
}

int hoop__registered_for_peers(hoop_comm *comm, const void *ptr, size_t len, int *device) {
  hoop__net_enter(comm);
  const hoop__registration *reg = hoop__registration_find(comm, ptr, len);
  for (int p = 0; reg && p < comm->size; p++)
    if (p != comm->rank && !reg->transport_mem[hoop__transport_of_peer(comm, p)])
      reg = NULL;
  if (device)
    *device = reg ? reg->device : 0;
  hoop__net_leave(comm);
  return reg != NULL;
}

int hoop__registered(hoop_comm *comm, const void *ptr, size_t len) {
  hoop__net_enter(comm);
  const hoop__registration *reg = hoop__registration_find(comm, ptr, len);
  int found = reg && reg->handle != 0;
  hoop__net_leave(comm);
  return found;
}

float *hoop__registration_floats(hoop_comm *comm, const void *ptr, size_t len, size_t count,
                                 uint64_t key, int device) {
  hoop__net_enter(comm);
  hoop__registration *reg = (hoop__registration *)hoop__registration_find(comm, ptr, len);
  struct hoop__kept *kept = reg && reg->handle != 0 ? reg->kept : NULL;
  while (kept && (kept->at != ptr || kept->key != key || kept->count != count ||
                  (kept->device != NULL) != (device != 0)))
    kept = kept->next;
  if (!kept && reg && reg->handle != 0 &&
      (kept = calloc(1, sizeof *kept + (device ? 0 : count * sizeof(float)))) != NULL) {
    if (device && !(kept->device = device_floats(comm, ptr, count))) {
      free(kept);
      kept = NULL;
    } else {
      kept->next = reg->kept;
      kept->at = ptr;
      kept->key = key;
      kept->count = count;
      reg->kept = kept;
    }
  }
  hoop__net_leave(comm);
  return !kept ? NULL : kept->device ? kept->device : kept->floats;
}

hoop_result hoop__register_internal(hoop_comm *comm, void *ptr, size_t bytes) {
  hoop__net_enter(comm);
  hoop_result result = add(comm, ptr, bytes, 0);
  hoop__net_leave(comm);
  return result;
}

void hoop__deregister_internal(hoop_comm *comm, const void *ptr) {
  hoop_comm *net = hoop__net(comm);
  hoop__net_enter(comm);
  for (size_t i = 0; i < net->mem_state->reg_count; i++)
    if (net->mem_state->regs[i].handle == 0 && net->mem_state->regs[i].base == ptr &&
        net->mem_state->regs[i].owner == comm) {
      release(net, i);
      break;
    }
  hoop__net_leave(comm);
}

void hoop__registrations_release(hoop_comm *comm) {
  hoop_comm *net = hoop__net(comm);
  hoop__net_enter(comm);
  for (size_t i = net->mem_state->reg_count; i-- > 0;)
    if (net->mem_state->regs[i].owner == comm || comm == net)
      release(net, i);
  if (comm == net) {
    free(net->mem_state->regs);
    net->mem_state->regs = NULL;
    net->mem_state->reg_capacity = 0;
  }
  hoop__net_leave(comm);
}
