/* health_text.c - a running job's health in words, as hoopd --status and hooprun --report print
 * it: the late ranks, and the slowest links. */
#include "rdzv/server.h"
#include "util/buf.h"

void hoop__health_late_text(const hoop__job_health *health, hoop__buf *out) {
  if (health->calls == 0 || health->nlate == 0) {
    hoop__buf_printf(out, "(no calls that every rank described yet)");
    return;
  }
  for (uint32_t l = 0; l < health->nlate; l++) {
    const hoop__late *late = &health->late[l];
    hoop__buf_printf(out, "%s%u: %.1f ms (p99 %.1f, max %.1f)", l ? "; " : "", late->rank,
                     late->median_us / 1000.0, late->p99_us / 1000.0, late->max_us / 1000.0);
  }
}

void hoop__health_links_text(const hoop__job_health *health, hoop__buf *out) {
  for (uint32_t l = 0; l < health->nlinks; l++) {
    const hoop__link *link = &health->links[l];
    hoop__buf_printf(out, "%s%u -> %u: %.1f MB/s", l ? "; " : "", link->from, link->to,
                     (double)link->bytes / (double)link->us);
  }
}
