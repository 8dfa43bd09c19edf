/* compressed.c - allreduce and reduce-scatter whose bytes between hosts travel in a smaller wire
 * format (hoop.h, hoop_compress; mem/compress.h), exact within each host. The shape is hier's:
 * each host's ranks reduce exactly among themselves, the ranks at the same place on every host
 * exchange their host's partial sums, and (allreduce) each host's ranks spread the result. The
 * exchange between hosts is direct rather than a ring, so that each value is rounded to the
 * format once on the way in, not at every hop: member j of the H members sums block j, its own
 * part exactly and the others' decoded, in float32 and in member order; for an allreduce it then
 * encodes the sum once and sends it to every member, and keeps the decoded values itself, so
 * every rank ends with the same bits. An allreduce's steps within the host run chunk by chunk
 * inside the exchange's pipeline (host_steps), not before and after it.
 *
 * The exchange encodes and decodes with the memory kind's codec (mem/kind.h): on host memory
 * compress.c's, and on device memory, where CUDA IPC did the host's steps (coll/mapped.c), the
 * kind's kernels, the pieces copied between a device mirror of the exchange's buffer and the
 * buffer itself, which the transports read and write. Either way the messages between hosts are
 * the same, so a host whose ranks stage their device buffers meets one whose ranks do not. */
#include <stdlib.h>

#include "coll/coll.h"
#include "coll/state.h"
#include "mem/compress.h"
#include "mem/kind.h"
#include "mem/reduce.h"

/* The chunks a block goes in, at least, unless that makes them smaller than PIPELINE_MIN_ELEMS. */
#define PIPELINE 16
#define PIPELINE_MIN_ELEMS 16384

/* Pieces start on cache lines in the exchange's buffer. */
static size_t line_up(size_t bytes) {
  return (bytes + 63) & ~(size_t)63;
}

/* One exchange among the members of group (one rank of each host): src holds count elements, this
 * host's partial sums; block j of them (hoop__segment's) is summed by member j. Each block goes in
 * the same number of chunks (chunk c of block j: hoop__segment's c-th of its elements), through a
 * pipeline: chunk c + 1's pieces are encoded and sent while chunk c is summed and its sum sent,
 * and chunk c - 1's sums arrive, so that the links stay busy while the CPU encodes and decodes.
 * Between two members, each side posts its sends and receives in the same order. */
typedef struct exchange {
  const hoop__group *group;
  const char *src;
  char *dst; /* allreduce: every block; reduce-scatter: this member's block, at dst itself */
  size_t count, esize;
  hoop_dtype dtype;
  hoop_op op;
  int format, spread; /* spread: allreduce (every block to every member) */
  size_t basis;       /* the elements whose blocks set the chunks (0: count), alike on every host */
  int members, me, chunks;
  size_t *first, *elems; /* per member: its block */
  /* per member and chunk (index j * chunks + c): where the piece it sends or receives lies in
   * the buffer; stage: this member's pieces of block j (and, at its own index, its sums); pieces:
   * member j's piece of this member's block; sums: member j's sums of its block */
  size_t *stage_at, *pieces_at, *sums_at;
  hoop__transfer **piece_recv, **sum_recv;
  char *buf;
  size_t bytes, sum_at; /* of buf: the pieces, then (in the kind's memory) the sums */
  char *dev;     /* device memory: where the kind encodes and decodes buf's pieces (NULL: in buf) */
  size_t dev_at; /* where dev starts in the kind's scratch (a reduce-scatter's sums go before) */
  float *sum;    /* this member's block, summed, in the kind's memory */
  /* Error feedback: the call's input and its bytes (NULL: none); what the encodings dropped, of
   * the pieces sent (by element of src) and of this member's sums, kept with its registration. */
  const void *feedback_buf;
  size_t feedback_bytes;
  float *kept_pieces, *kept_sums;
  struct host_steps *host; /* the exact steps within the host, in the pipeline */
} exchange;

/* A call whose rank shares its host: the host's exact steps run inside the exchange's pipeline,
 * chunk by chunk, rather than before and after it, so that the links are not idle while the host
 * reduces and spreads. Local member m owns a segment: an allreduce's segment m of the call's
 * elements; a reduce-scatter's blocks of the ranks at place m on every host, in host order (block
 * j of the exchange is host j's). For chunk c, each member sends every other member m its input's
 * chunk c of every block of m's segment, and sums the pieces of its own segment's chunk c that it
 * receives, exactly and in the call's dtype (its own part first, then the others' from the next
 * member on), where the exchange takes them; that chunk is then encoded and sent between hosts,
 * and (allreduce) once its sums are decoded it goes to every other member of the host. Chunk
 * c + 1's pieces within the host are in flight while chunk c is encoded. */
typedef struct host_steps {
  const hoop__group *local;
  const char *input;             /* the call's input */
  char *out;                     /* the call's output */
  size_t *seg_first, *seg_elems; /* per local member (allreduce: where its segment starts) */
  const int *at;                 /* reduce-scatter: the ranks by host and place; NULL: allreduce */
  size_t block;                  /* reduce-scatter: the elements of one rank's block */
  char *sums;                    /* this member's summed chunks: the exchange's input */
  size_t slot;                   /* bytes of one received piece in scratch */
  char *scratch; /* received pieces: 2 chunks x (the host's members - 1) peers x blocks (hosts) */
  hoop__transfer **recv; /* their receives, by the same index */
  const void **parts;    /* by offset k from this member: a chunk's pieces, while they are summed */
  hoop__arena sends, landing;
} host_steps;

/* Chunk c of member j's block: its first element (in src) and its count. */
static void chunk_of(const exchange *ex, int j, int c, size_t *first, size_t *elems) {
  hoop__segment(ex->elems[j], ex->chunks, c, first, elems);
  *first += ex->first[j];
}

static size_t piece_bytes(const exchange *ex, int j, int c) {
  size_t first, elems;
  chunk_of(ex, j, c, &first, &elems);
  return hoop__compress_bytes(ex->format, elems);
}

/* The random bits of a stochastic encode: alike for every run of the job, different for every
 * call, rank and step (0 when the format rounds to nearest). */
static hoop__rounding rounding_of(const hoop_comm *comm, const exchange *ex, int step,
                                  size_t first) {
  if (!(ex->format & HOOP_COMPRESS_STOCHASTIC))
    return (hoop__rounding){0, 0};
  uint64_t seed = comm->seq * 0x9e3779b97f4a7c15u ^ (uint64_t)comm->rank << 32 ^ (uint64_t)step;
  return (hoop__rounding){seed | 1, first};
}

/* Lay the exchange's pieces out in the communicator's buffer for it. */
static hoop_result plan(hoop_comm *comm, exchange *ex) {
  int h = ex->group->size, me = ex->group->index;
  ex->members = h, ex->me = me;
  size_t largest = 0;
  ex->first = calloc(2 * (size_t)h, sizeof *ex->first);
  if (!ex->first)
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "%s: out of memory", comm->call);
  ex->elems = ex->first + h;
  for (int j = 0; j < h; j++)
    hoop__segment(ex->count, h, j, &ex->first[j], &ex->elems[j]);
  /* The largest block: of this exchange, or of any member's segment of the host, so that every
   * member of the host cuts its blocks into the same number of chunks. */
  size_t basis = ex->basis ? ex->basis : ex->count;
  largest = basis / (size_t)h + (basis % (size_t)h != 0);
  /* HOOP_CHUNK_BYTES of the call's elements a chunk and an eighth of it on the wire, fewer where
   * that leaves a block fewer than PIPELINE chunks (the pipeline needs a few to hide the
   * encoding), whole blocks of the format. */
  size_t chunk = comm->coll->chunk_bytes / ex->esize;
  size_t wire = comm->coll->chunk_bytes / 8 * HOOP_COMPRESS_BLOCK /
                hoop__compress_bytes(ex->format, HOOP_COMPRESS_BLOCK);
  chunk = wire < chunk ? wire : chunk;
  if (largest / PIPELINE < chunk)
    chunk = largest / PIPELINE > PIPELINE_MIN_ELEMS ? largest / PIPELINE : PIPELINE_MIN_ELEMS;
  chunk = (chunk + HOOP_COMPRESS_BLOCK - 1) / HOOP_COMPRESS_BLOCK * HOOP_COMPRESS_BLOCK;
  ex->chunks = (int)((largest + chunk - 1) / chunk);
  ex->chunks = ex->chunks < 1 ? 1 : ex->chunks > 4096 ? 4096 : ex->chunks;
  size_t pieces = (size_t)h * (size_t)ex->chunks;
  ex->stage_at = calloc(3 * pieces, sizeof *ex->stage_at);
  ex->piece_recv = calloc(2 * pieces, sizeof *ex->piece_recv);
  if (!ex->stage_at || !ex->piece_recv)
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "%s: out of memory", comm->call);
  ex->pieces_at = ex->stage_at + pieces, ex->sums_at = ex->pieces_at + pieces;
  ex->sum_recv = ex->piece_recv + pieces;
  size_t at = 0;
  for (int j = 0; j < h; j++)
    for (int c = 0; c < ex->chunks; c++) {
      size_t i = (size_t)j * (size_t)ex->chunks + (size_t)c;
      ex->stage_at[i] = at;
      at += line_up(piece_bytes(ex, j, c));
      if (j == me)
        continue;
      ex->pieces_at[i] = at;
      at += line_up(piece_bytes(ex, me, c));
      ex->sums_at[i] = at;
      at += ex->spread ? line_up(piece_bytes(ex, j, c)) : 0;
    }
  ex->bytes = at + line_up(ex->elems[me] * sizeof(float));
  ex->sum_at = at;
  return HOOP_OK;
}

/* Where the kind encodes or decodes the piece at this place of the buffer. */
static char *work(const exchange *ex, size_t at) {
  return (ex->dev ? ex->dev : ex->buf) + at;
}

/* The exchange's buffer, and on device memory its mirror there (the kind's scratch, taken before
 * any receive is posted). */
static hoop_result take_buffers(hoop_comm *comm, exchange *ex) {
  int device = comm->mem->device != NULL;
  ex->buf = hoop__host_buf_grow(comm, &comm->coll->compress_buf, ex->bytes, device ? ex->src : NULL,
                                "for compressed pieces");
  char *scratch = device ? hoop__kind_scratch(comm, ex->dev_at + ex->bytes + 1) : NULL;
  if (!ex->buf || (device && !scratch))
    return HOOP_ERR_SYSTEM;
  ex->dev = scratch ? scratch + ex->dev_at : NULL;
  ex->sum = (float *)(void *)work(ex, ex->sum_at);
  return HOOP_OK;
}

/* Device memory: a piece the kind encoded, queued to be copied where the transports read it
 * (after the encoding), and a received one to where the kind decodes it (before the decoding,
 * which is queued after it; the buffer's bytes stay until the exchange's last wait); wire_ready
 * waits for the copies out. Nothing to do on host memory. */
static hoop_result out_to_wire(hoop_comm *comm, exchange *ex, size_t at, size_t bytes) {
  return ex->dev ? comm->mem->copy_queued(comm, ex->buf + at, ex->dev + at, bytes) : HOOP_OK;
}
static hoop_result in_from_wire(hoop_comm *comm, exchange *ex, size_t at, size_t bytes) {
  return ex->dev ? comm->mem->copy_queued(comm, ex->dev + at, ex->buf + at, bytes) : HOOP_OK;
}
static hoop_result wire_ready(hoop_comm *comm, exchange *ex) {
  return ex->dev ? comm->mem->sync(comm) : HOOP_OK;
}

static void unplan(exchange *ex) {
  free(ex->first);
  free(ex->stage_at);
  free(ex->piece_recv);
}

/* Chunk c of every peer's block (sums: its sums) or of this member's (its pieces) received from
 * it, into its place in the buffer, its transfer kept by member and chunk. */
static hoop_result post_receives(hoop_comm *comm, exchange *ex, int c, int sums,
                                 hoop__arena *landing) {
  int h = ex->members, me = ex->me;
  hoop_result result = HOOP_OK;
  for (int k = 1; k < h && result == HOOP_OK; k++) {
    int j = (me + k) % h;
    size_t i = (size_t)j * (size_t)ex->chunks + (size_t)c;
    hoop__transfer **recv = sums ? &ex->sum_recv[i] : &ex->piece_recv[i];
    *recv = hoop__arena_next(comm, landing);
    result = *recv ? hoop__irecv(comm, hoop__member(ex->group, j),
                                 ex->buf + (sums ? ex->sums_at[i] : ex->pieces_at[i]),
                                 piece_bytes(ex, sums ? j : me, c), *recv)
                   : HOOP_ERR_SYSTEM;
  }
  return result;
}

/* This member's piece of member j's block, chunk c, sent from where the transports read it. */
static hoop_result send_piece(hoop_comm *comm, exchange *ex, int j, int c, hoop__arena *sends) {
  size_t i = (size_t)j * (size_t)ex->chunks + (size_t)c;
  return hoop__arena_isend(comm, sends, hoop__member(ex->group, j), ex->buf + ex->stage_at[i],
                           piece_bytes(ex, j, c));
}

/* Chunk c's pieces: every peer's piece of this member's block received, and this member's piece
 * of every peer's block encoded and sent (the next member first, so that no member is everyone's
 * first): each as soon as it is encoded on the host, all after one wait on the device. */
static hoop_result send_pieces(hoop_comm *comm, exchange *ex, int c, hoop__arena *sends,
                               hoop__arena *landing) {
  int h = ex->members, me = ex->me;
  hoop_result result = post_receives(comm, ex, c, 0, landing);
  for (int k = 1; k < h && result == HOOP_OK; k++) {
    int j = (me + k) % h;
    size_t first, elems, i = (size_t)j * (size_t)ex->chunks + (size_t)c;
    chunk_of(ex, j, c, &first, &elems);
    hoop__rounding draws = rounding_of(comm, ex, 0, first);
    result = comm->mem->encode(
        comm, ex->format, work(ex, ex->stage_at[i]), ex->src + first * ex->esize, ex->dtype, elems,
        ex->kept_pieces ? ex->kept_pieces + first : NULL, draws.seed, draws.first);
    if (result == HOOP_OK)
      result = out_to_wire(comm, ex, ex->stage_at[i], hoop__compress_bytes(ex->format, elems));
    if (result == HOOP_OK && !ex->dev)
      result = send_piece(comm, ex, j, c, sends);
  }
  if (result == HOOP_OK && ex->dev)
    result = wire_ready(comm, ex);
  for (int k = 1; k < h && result == HOOP_OK && ex->dev; k++)
    result = send_piece(comm, ex, (me + k) % h, c, sends);
  return result;
}

/* Chunk c of this member's block summed in float32, its own part exactly and every peer's piece
 * decoded, in member order; for an allreduce, the sum encoded once and sent to every peer (whose
 * sums of chunk c are received), and decoded into this member's own place as they will decode
 * it. A reduce-scatter's sum goes to dst as it is. */
static hoop_result sum_chunk(hoop_comm *comm, exchange *ex, int c, hoop__arena *sends,
                             hoop__arena *landing) {
  int h = ex->members, me = ex->me;
  size_t first, elems;
  chunk_of(ex, me, c, &first, &elems);
  float *sum = ex->sum + (first - ex->first[me]);
  hoop_result result = comm->mem->widen(comm, sum, ex->src + first * ex->esize, ex->dtype, elems);
  for (int j = 0; j < h && result == HOOP_OK; j++) {
    size_t i = (size_t)j * (size_t)ex->chunks + (size_t)c;
    if (j == me || (result = hoop__wait(comm, ex->piece_recv[i])) != HOOP_OK ||
        (result = in_from_wire(comm, ex, ex->pieces_at[i], piece_bytes(ex, me, c))) != HOOP_OK)
      continue;
    result = comm->mem->decode_add(comm, ex->format, sum, work(ex, ex->pieces_at[i]), elems);
  }
  if (result == HOOP_OK)
    result = hoop__kind_finish(comm, sum, elems, HOOP_FLOAT32, ex->op, comm->size);
  if (result != HOOP_OK)
    return result;
  if (!ex->spread)
    return comm->mem->narrow(comm, ex->dst + (first - ex->first[me]) * ex->esize, ex->dtype, sum,
                             elems);
  result = post_receives(comm, ex, c, 1, landing);
  size_t at = ex->stage_at[(size_t)me * (size_t)ex->chunks + (size_t)c];
  size_t bytes = hoop__compress_bytes(ex->format, elems);
  hoop__rounding draws = rounding_of(comm, ex, 1, first);
  if (result == HOOP_OK)
    result = comm->mem->encode(comm, ex->format, work(ex, at), sum, HOOP_FLOAT32, elems,
                               ex->kept_sums ? ex->kept_sums + (first - ex->first[ex->me]) : NULL,
                               draws.seed, draws.first);
  if (result == HOOP_OK)
    result = out_to_wire(comm, ex, at, bytes);
  if (result == HOOP_OK)
    result = wire_ready(comm, ex);
  for (int k = 1; k < h && result == HOOP_OK; k++)
    result =
        hoop__arena_isend(comm, sends, hoop__member(ex->group, (me + k) % h), ex->buf + at, bytes);
  if (result == HOOP_OK)
    result = comm->mem->decode(comm, ex->format, ex->dst + first * ex->esize, ex->dtype,
                               work(ex, at), elems);
  return result;
}

/* Chunk c's sums from every peer, decoded into their places. */
static hoop_result take_sums(hoop_comm *comm, exchange *ex, int c) {
  hoop_result result = HOOP_OK;
  for (int j = 0; j < ex->members && result == HOOP_OK; j++) {
    size_t first, elems, i = (size_t)j * (size_t)ex->chunks + (size_t)c;
    if (j == ex->me || (result = hoop__wait(comm, ex->sum_recv[i])) != HOOP_OK ||
        (result = in_from_wire(comm, ex, ex->sums_at[i], piece_bytes(ex, j, c))) != HOOP_OK)
      continue;
    chunk_of(ex, j, c, &first, &elems);
    result = comm->mem->decode(comm, ex->format, ex->dst + first * ex->esize, ex->dtype,
                               work(ex, ex->sums_at[i]), elems);
  }
  return result;
}

/* ---- the host's steps, in the pipeline ------------------------------------------------------- */

/* Chunk c of block j of local member m's segment (chunk_of's, for any member): where it lies in
 * the segment (place) and in the call's input and (allreduce) output, and its count. */
static void slice_of(const exchange *ex, int m, int j, int c, size_t *place, size_t *input,
                     size_t *elems) {
  const host_steps *hs = ex->host;
  size_t block_first, block_elems, first;
  hoop__segment(hs->seg_elems[m], ex->members, j, &block_first, &block_elems);
  hoop__segment(block_elems, ex->chunks, c, &first, elems);
  *place = block_first + first;
  *input = (hs->at ? (size_t)hs->at[j * hs->local->size + m] * hs->block
                   : hs->seg_first[m] + block_first) +
           first;
}

static size_t slot_index(const exchange *ex, int c, int k, int j) {
  return ((size_t)(c & 1) * (size_t)(ex->host->local->size - 1) + (size_t)(k - 1)) *
             (size_t)ex->members +
         (size_t)j;
}

/* Chunk c between this member and every other member m of its host (the next member first),
 * block by block, both sides posting in the same order. gather: m's input for this member's
 * segment received into scratch, and this member's input for m's segment sent to it; else (the
 * spread) m's final chunk received into the output, and this member's sent to m. */
static hoop_result host_swap(hoop_comm *comm, exchange *ex, int c, int gather) {
  host_steps *hs = ex->host;
  int n = hs->local->size, me = hs->local->index;
  hoop_result result = HOOP_OK;
  for (int k = 1; k < n && result == HOOP_OK; k++) {
    int m = (me + k) % n, peer = hoop__member(hs->local, m);
    for (int j = 0; j < ex->members && result == HOOP_OK; j++) {
      size_t place, in_first, in_elems, out_first, out_elems, i = slot_index(ex, c, k, j);
      slice_of(ex, gather ? me : m, j, c, &place, &in_first, &in_elems);
      slice_of(ex, gather ? m : me, j, c, &place, &out_first, &out_elems);
      hoop__transfer *recv = hoop__arena_next(comm, &hs->landing);
      if (!recv)
        return HOOP_ERR_SYSTEM;
      if (gather)
        hs->recv[i] = recv;
      char *into = gather ? hs->scratch + i * hs->slot : hs->out + in_first * ex->esize;
      result = hoop__irecv(comm, peer, into, in_elems * ex->esize, recv);
      const char *from = (gather ? hs->input : hs->out) + out_first * ex->esize;
      if (result == HOOP_OK)
        result = hoop__arena_isend(comm, &hs->sends, peer, from, out_elems * ex->esize);
    }
  }
  return result;
}

/* Chunk c of this member's segment summed exactly where the exchange takes it; then chunk c + 1's
 * pieces posted. */
static hoop_result host_reduce(hoop_comm *comm, exchange *ex, int c) {
  host_steps *hs = ex->host;
  int n = hs->local->size, me = hs->local->index;
  hoop_result result = HOOP_OK;
  for (int j = 0; j < ex->members && result == HOOP_OK; j++) {
    size_t place, first, elems;
    slice_of(ex, me, j, c, &place, &first, &elems);
    for (int k = 1; k < n && result == HOOP_OK; k++) {
      size_t i = slot_index(ex, c, k, j);
      result = hoop__wait(comm, hs->recv[i]);
      hs->parts[k] = hs->scratch + i * hs->slot;
    }
    if (result != HOOP_OK || elems == 0)
      continue;
    char *sum = hs->sums + place * ex->esize;
    hoop__reduce3(sum, hs->input + first * ex->esize, hs->parts[1], elems, ex->dtype, ex->op);
    for (int k = 2; k < n; k++)
      hoop__reduce(sum, hs->parts[k], elems, ex->dtype, ex->op);
  }
  if (result == HOOP_OK && c + 1 < ex->chunks)
    result = host_swap(comm, ex, c + 1, 1);
  return result;
}

/* Scratch for two chunks' received pieces (and a reduce-scatter's sums, the exchange's input);
 * chunk 0's posted and summed, chunk 1's posted. */
static hoop_result host_begin(hoop_comm *comm, exchange *ex) {
  host_steps *hs = ex->host;
  int n = hs->local->size;
  size_t largest = hs->seg_elems[0] / (size_t)ex->members + 1;
  hs->slot = line_up((largest / (size_t)ex->chunks + 1) * ex->esize);
  size_t slots = 2 * (size_t)(n - 1) * (size_t)ex->members;
  size_t sums = hs->at ? line_up(ex->count * ex->esize) : 0;
  char *buf = hoop__host_buf_grow(comm, &comm->coll->compress_input, sums + slots * hs->slot, NULL,
                                  "for a compressed call's pieces within the host");
  hs->recv = calloc(slots, sizeof *hs->recv);
  hs->parts = calloc((size_t)n, sizeof *hs->parts);
  if (!buf || !hs->recv || !hs->parts)
    return buf ? hoop__set_error(comm, HOOP_ERR_SYSTEM, "%s: out of memory", comm->call)
               : HOOP_ERR_SYSTEM;
  hs->scratch = buf + sums;
  if (hs->at)
    ex->src = hs->sums = buf;
  hoop_result result = host_swap(comm, ex, 0, 1);
  return result == HOOP_OK ? host_reduce(comm, ex, 0) : result;
}

static hoop_result host_end(hoop_comm *comm, exchange *ex, hoop_result result) {
  host_steps *hs = ex->host;
  if (result == HOOP_OK)
    result = hoop__arena_wait_all(comm, &hs->landing);
  if (result == HOOP_OK)
    result = hoop__arena_wait_all(comm, &hs->sends);
  hoop__arena_free(&hs->landing);
  hoop__arena_free(&hs->sends);
  free(hs->recv);
  free(hs->parts);
  return result;
}

/* Error feedback's residuals, kept with the input's registration for calls of this shape (in the
 * kind's memory): this rank's pieces of the exchange, and its sums. */
static hoop_result find_residuals(hoop_comm *comm, exchange *ex) {
  if (!ex->feedback_buf)
    return HOOP_OK;
  size_t own = ex->spread ? ex->elems[ex->me] : 0;
  uint64_t key = ((uint64_t)ex->count * 0x9e3779b97f4a7c15u) ^ (uint64_t)ex->dtype << 56 ^
                 (uint64_t)ex->spread << 48 ^ (uint64_t)ex->me << 32 ^ (uint64_t)ex->members;
  float *kept = hoop__registration_floats(comm, ex->feedback_buf, ex->feedback_bytes,
                                          ex->count + own, key, ex->dev != NULL);
  if (!kept)
    return hoop__set_error(comm, HOOP_ERR_SYSTEM,
                           "%s: cannot keep %zu floats of error feedback's residuals%s", comm->call,
                           ex->count + own, ex->dev ? " in device memory" : "");
  ex->kept_pieces = kept;
  ex->kept_sums = own ? kept + ex->count : NULL;
  return HOOP_OK;
}

static hoop_result run_exchange(hoop_comm *comm, exchange *ex) {
  hoop_result result = plan(comm, ex);
  if (result == HOOP_OK)
    result = take_buffers(comm, ex);
  if (result == HOOP_OK)
    result = find_residuals(comm, ex);
  if (result == HOOP_OK && ex->host)
    result = host_begin(comm, ex);
  hoop__arena sends = {0}, landing = {0};
  if (result == HOOP_OK)
    result = send_pieces(comm, ex, 0, &sends, &landing);
  for (int c = 0; c < ex->chunks && result == HOOP_OK; c++) {
    if (c + 1 < ex->chunks && ex->host)
      result = host_reduce(comm, ex, c + 1);
    if (result == HOOP_OK && c + 1 < ex->chunks)
      result = send_pieces(comm, ex, c + 1, &sends, &landing);
    if (result == HOOP_OK)
      result = sum_chunk(comm, ex, c, &sends, &landing);
    if (result == HOOP_OK && ex->spread && c > 0)
      result = take_sums(comm, ex, c - 1);
    if (result == HOOP_OK && ex->host && ex->spread && c > 0)
      result = host_swap(comm, ex, c - 1, 0);
  }
  if (result == HOOP_OK && ex->spread)
    result = take_sums(comm, ex, ex->chunks - 1);
  if (result == HOOP_OK && ex->host && ex->spread)
    result = host_swap(comm, ex, ex->chunks - 1, 0);
  if (result == HOOP_OK)
    result = hoop__arena_wait_all(comm, &sends);
  /* Device memory: the last decodes done before the caller's peers read the result. */
  if (result == HOOP_OK && ex->dev)
    result = comm->mem->sync(comm);
  if (ex->host)
    result = host_end(comm, ex, result);
  hoop__arena_free(&landing);
  hoop__arena_free(&sends);
  unplan(ex);
  return result;
}

/* The exchange with the host's steps in it: each member's segment, of ex->count elements (a
 * reduce-scatter's, each the same) or of the call's count (an allreduce's, which the exchange then
 * runs on in place in the output). */
static hoop_result run_with_host(hoop_comm *comm, exchange *ex, host_steps *host) {
  int n = host->local->size, me = host->local->index;
  host->seg_first = calloc(2 * (size_t)n, sizeof *host->seg_first);
  if (!host->seg_first)
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "%s: out of memory", comm->call);
  host->seg_elems = host->seg_first + n;
  for (int m = 0; m < n; m++) {
    if (host->at)
      host->seg_elems[m] = ex->count;
    else
      hoop__segment(ex->count, n, m, &host->seg_first[m], &host->seg_elems[m]);
  }
  if (!host->at) {
    ex->src = ex->dst = host->sums = host->out + host->seg_first[me] * ex->esize;
    ex->count = host->seg_elems[me];
  }
  ex->basis = host->seg_elems[0];
  ex->host = host;
  hoop_result result = run_exchange(comm, ex);
  free(host->seg_first);
  return result;
}

/* ---- the algorithms ------------------------------------------------------------------------- */

int hoop__compressed_fits(const hoop_comm *comm) {
  const hoop__hosts *hosts = comm->coll->hosts;
  return hosts && (hosts->even || (hosts->count == comm->size && comm->size > 1));
}

/* This rank's host's ranks, and the ranks at its place on every host. */
static void groups(const hoop_comm *comm, hoop__group *local, hoop__group *cross) {
  const hoop__hosts *hosts = comm->coll->hosts;
  *local = (hoop__group){hosts->per_host, hosts->local_index, hosts->local};
  *cross = (hoop__group){hosts->count, hosts->host_index, hosts->cross};
}

/* The exchange of a call among the ranks at this rank's place on every host: an allreduce's of
 * every element (every block to every member), a reduce-scatter's of the blocks of those ranks
 * (each member's result its own). */
static exchange call_exchange(const hoop_comm *comm, const hoop__coll_args *args,
                              const hoop__group *cross) {
  int spread = args->coll == HOOP__COLL_ALLREDUCE;
  return (exchange){.group = cross,
                    .src = args->sendbuf,
                    .dst = args->recvbuf,
                    .count = spread ? args->count : args->count * (size_t)cross->size,
                    .esize = args->esize,
                    .dtype = args->dtype,
                    .op = args->op,
                    .format = args->compress,
                    .spread = spread,
                    .feedback_buf = args->feedback_buf,
                    .feedback_bytes = spread ? args->bytes : args->bytes * (size_t)comm->size};
}

hoop_result hoop__allreduce_compressed(hoop_comm *comm, const hoop__coll_args *args) {
  if (!args->compress || !hoop__compressed_fits(comm))
    return hoop__allreduce_hier(comm, args);
  hoop__group local, cross;
  groups(comm, &local, &cross);
  exchange ex = call_exchange(comm, args, &cross);
  if (local.size == 1)
    return run_exchange(comm, &ex);
  host_steps host = {.local = &local, .input = args->sendbuf, .out = args->recvbuf};
  return run_with_host(comm, &ex, &host);
}

/* A reduce-scatter: the ranks at place l of every host own their blocks together, so the rank at
 * place l sums its host's parts of them (host_steps, inside the exchange's pipeline), and the
 * exchange then sums each rank's block across the hosts. */
hoop_result hoop__reduce_scatter_compressed(hoop_comm *comm, const hoop__coll_args *args) {
  if (!args->compress || !hoop__compressed_fits(comm))
    return hoop__reduce_scatter_ring(comm, args);
  hoop__group local, cross;
  groups(comm, &local, &cross);
  exchange ex = call_exchange(comm, args, &cross);
  if (local.size == 1)
    return run_exchange(comm, &ex);
  host_steps host = {.local = &local,
                     .input = args->sendbuf,
                     .out = args->recvbuf,
                     .at = comm->coll->hosts->at,
                     .block = args->count};
  return run_with_host(comm, &ex, &host);
}

/* The exchange of a call whose host's steps ran elsewhere (coll/mapped.c), as the staged call's,
 * member for member and chunk for chunk: an allreduce's on its segment at this rank's place on
 * its host (in place), a reduce-scatter's on its sums of the blocks of the ranks at its place on
 * every host, which the kind's scratch holds before the exchange's mirror. */
static exchange hosts_exchange(const hoop_comm *comm, const hoop__coll_args *args,
                               const hoop__group *cross, char *segment, size_t len) {
  exchange ex = call_exchange(comm, args, cross);
  ex.src = segment;
  if (ex.spread) {
    size_t first;
    hoop__segment(args->count, comm->coll->hosts->per_host, 0, &first, &ex.basis);
    ex.dst = segment;
    ex.count = len;
  } else {
    ex.dev_at = line_up(ex.count * args->esize);
  }
  return ex;
}

hoop_result hoop__compressed_by_host(hoop_comm *comm, const hoop__coll_args *args, char *segment,
                                     size_t len) {
  hoop__group local, cross;
  groups(comm, &local, &cross);
  exchange ex = hosts_exchange(comm, args, &cross, segment, len);
  return run_exchange(comm, &ex);
}

size_t hoop__compressed_by_host_scratch(hoop_comm *comm, const hoop__coll_args *args, size_t len) {
  hoop__group local, cross;
  groups(comm, &local, &cross);
  exchange ex = hosts_exchange(comm, args, &cross, NULL, len);
  size_t bytes = plan(comm, &ex) == HOOP_OK ? ex.dev_at + ex.bytes + 1 : 0;
  unplan(&ex);
  return bytes;
}

void hoop__compressed_free(hoop_comm *comm) {
  hoop__host_buf_free(comm, &comm->coll->compress_buf);
  hoop__host_buf_free(comm, &comm->coll->compress_input);
}
