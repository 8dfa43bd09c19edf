/* ipc_map.c - the cache of peers' device buffers mapped by CUDA IPC (see ipc_map.h). */
#include "config.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/random.h>
#include <unistd.h>

#include "core/internal.h"
#include "core/log.h"
#include "mem/ipc_map.h"

/* Mappings kept for the process at most, unless every one is in use. */
#define MAX_MAPS 64

typedef struct hoop__ipc_mapping {
  uint64_t process; /* the exporting process (hoop__ipc_process there) */
  void *context;    /* the context it is mapped into */
  hoop__cuda_export from;
  void *base; /* the allocation mapped here */
  uint64_t used;
  int busy;  /* calls reading it now */
  int stale; /* the exporter's range holds another allocation now: closed once idle */
  struct hoop__ipc_mapping *next;
} mapping;

static pthread_mutex_t maps_lock = PTHREAD_MUTEX_INITIALIZER;
static mapping *maps;
static int nmaps;
static uint64_t maps_clock;

static pthread_mutex_t process_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t process_id;
static pid_t process_pid;

uint64_t hoop__ipc_process(void) {
  pthread_mutex_lock(&process_lock);
  pid_t pid = getpid();
  if (process_pid != pid) {
    if (getrandom(&process_id, sizeof process_id, GRND_NONBLOCK) != (ssize_t)sizeof process_id)
      process_id = ((uint64_t)pid << 32) ^ (uint64_t)(hoop__now() * 1e9);
    process_id |= 1; /* never 0 */
    process_pid = pid;
  }
  uint64_t id = process_id;
  pthread_mutex_unlock(&process_lock);
  return id;
}

/* ---- the ranks of this process --------------------------------------------------------------- */

static struct local_rank {
  uint64_t job;
  int rank, count;
} * locals;
static size_t nlocals, caplocals;

void hoop__ipc_local_add(uint64_t job, int rank) {
  pthread_mutex_lock(&process_lock);
  size_t i = 0;
  while (i < nlocals && (locals[i].job != job || locals[i].rank != rank))
    i++;
  if (i == nlocals && nlocals == caplocals) {
    size_t cap = caplocals ? 2 * caplocals : 16;
    struct local_rank *grown = realloc(locals, cap * sizeof *grown);
    if (!grown) { /* unknown here: its descriptors are then refused, and its calls staged */
      pthread_mutex_unlock(&process_lock);
      return;
    }
    locals = grown;
    caplocals = cap;
  }
  if (i == nlocals)
    locals[nlocals++] = (struct local_rank){job, rank, 0};
  locals[i].count++;
  pthread_mutex_unlock(&process_lock);
}

void hoop__ipc_local_remove(uint64_t job, int rank) {
  pthread_mutex_lock(&process_lock);
  for (size_t i = 0; i < nlocals; i++)
    if (locals[i].job == job && locals[i].rank == rank && --locals[i].count == 0) {
      locals[i] = locals[--nlocals];
      break;
    }
  pthread_mutex_unlock(&process_lock);
}

int hoop__ipc_local_has(uint64_t job, int rank) {
  pthread_mutex_lock(&process_lock);
  int found = 0;
  for (size_t i = 0; i < nlocals && !found; i++)
    found = locals[i].job == job && locals[i].rank == rank;
  pthread_mutex_unlock(&process_lock);
  return found;
}

/* Close and forget map (maps_lock held). */
static void unmap(mapping *map) {
  for (mapping **at = &maps; *at; at = &(*at)->next)
    if (*at == map) {
      *at = map->next;
      break;
    }
  nmaps--;
  hoop__cuda_ipc_close(map->context, map->base, &map->from);
  free(map);
}

void hoop__ipc_map_release(hoop__ipc_held *holder) {
  pthread_mutex_lock(&maps_lock);
  for (int i = 0; i < holder->nheld; i++) {
    mapping *map = holder->held[i];
    if (--map->busy == 0 && map->stale)
      unmap(map);
  }
  holder->nheld = 0;
  pthread_mutex_unlock(&maps_lock);
}

void hoop__ipc_map_forget(const uint64_t *processes, int n) {
  pthread_mutex_lock(&maps_lock);
  for (mapping *map = maps, *next; map; map = next) {
    next = map->next;
    for (int i = 0; i < n; i++)
      if (processes[i] && processes[i] == map->process) {
        map->stale = 1;
        if (!map->busy)
          unmap(map);
        break;
      }
  }
  pthread_mutex_unlock(&maps_lock);
}

/* A new mapping of from in context, entered in the cache, or NULL with why (maps_lock held). */
static mapping *map_new(int peer, uint64_t process, void *context, const hoop__cuda_export *from,
                        const void *near, char *why, size_t whylen) {
  /* A mapping of the exporter's memory in this range that is not this allocation: the exporter
   * freed it since, and the range now holds another. */
  for (mapping *map = maps, *next; map; map = next) {
    next = map->next;
    if (map->process == process && map->context == context &&
        hoop__cuda_export_conflict(&map->from, from)) {
      map->stale = 1;
      if (!map->busy)
        unmap(map);
    }
  }
  while (nmaps >= MAX_MAPS) {
    mapping *oldest = NULL;
    for (mapping *map = maps; map; map = map->next)
      if (!map->busy && (!oldest || map->used < oldest->used))
        oldest = map;
    if (!oldest)
      break; /* every one in use: grow past the bound for now */
    unmap(oldest);
  }
  void *base = NULL;
  char detail[160];
  mapping *made = calloc(1, sizeof *made);
  if (!made) {
    snprintf(why, whylen, "out of memory");
    return NULL;
  }
  if (hoop__cuda_ipc_open(near, from, &base, detail, sizeof detail) != 0) {
    snprintf(why, whylen, "rank %d's buffer: %s", peer, detail);
    free(made);
    return NULL;
  }
  *made =
      (mapping){.process = process, .context = context, .from = *from, .base = base, .next = maps};
  maps = made;
  nmaps++;
  HOOP__TRACE(HOOP_SUBSYS_COLL, "ipc: mapped rank %d's allocation of %llu bytes (id %llu) at %p",
              peer, (unsigned long long)from->size, (unsigned long long)from->buffer_id, base);
  return made;
}

char *hoop__ipc_map(hoop__ipc_held *holder, int peer, uint64_t process,
                    const hoop__cuda_export *from, const void *near, char *why, size_t whylen) {
  if (holder->nheld == holder->capacity) {
    int capacity = holder->capacity ? 2 * holder->capacity : 16;
    mapping **grown = realloc(holder->held, (size_t)capacity * sizeof *grown);
    if (!grown) {
      snprintf(why, whylen, "out of memory");
      return NULL;
    }
    holder->held = grown;
    holder->capacity = capacity;
  }
  void *context = hoop__cuda_context_of(near);
  pthread_mutex_lock(&maps_lock);
  mapping *hit = NULL;
  for (mapping *map = maps; map && !hit; map = map->next)
    if (!map->stale && map->process == process && map->context == context &&
        hoop__cuda_export_same(&map->from, from))
      hit = map;
  if (!hit)
    hit = map_new(peer, process, context, from, near, why, whylen);
  if (hit) {
    hit->used = ++maps_clock;
    hit->busy++;
    holder->held[holder->nheld++] = hit;
  }
  pthread_mutex_unlock(&maps_lock);
  return hit ? (char *)hit->base + from->offset : NULL;
}
