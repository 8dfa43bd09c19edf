/* test_gdr.c - the GPUDirect RDMA decision (lib/mem/gdr.c) against a stand-in for the driver's and
 * verbs' answers: every path of NCCL's order (off, dma-buf taken, dma-buf refused as unsupported
 * or otherwise, nvidia-peermem taken or refused, nothing), the page-widened range handed to the
 * dma-buf export and the offset and iova of its registration, the fd always closed, and HOOP_GDR's
 * values. Real GPUDirect RDMA needs a GPU and a NIC that takes dma-buf, which no machine of ours
 * has; the soft-RoCE guest (tests/rdma-vm) checks that rxe is found unsupported for real. */
#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mem/gdr.h"

/* What the stand-in answers, and what it was asked. */
typedef struct fake {
  int attr;            /* dmabuf_supported's answer */
  int fd_ok;           /* dmabuf_fd succeeds */
  int dmabuf_err;      /* 0: reg_dmabuf succeeds, else its errno */
  int peermem;         /* peermem_loaded's answer */
  int mr_err;          /* 0: reg_mr succeeds, else its errno */
  const void *fd_base; /* asked of dmabuf_fd */
  size_t fd_len;
  uint64_t offset, iova; /* asked of reg_dmabuf */
  size_t reg_len;
  int fds_open, reg_dmabuf_calls, reg_mr_calls;
} fake;

static char token_mr; /* the "MR" the stand-in returns */

static int f_attr(void *arg, const void *ptr) {
  (void)ptr;
  return ((fake *)arg)->attr;
}
static int f_fd(void *arg, const void *base, size_t len, int *fd, char *why, size_t whylen) {
  fake *f = arg;
  f->fd_base = base;
  f->fd_len = len;
  if (!f->fd_ok) {
    strncpy(why, "no export", whylen);
    return -1;
  }
  *fd = 42;
  f->fds_open++;
  return 0;
}
static void *f_reg_dmabuf(void *arg, int fd, uint64_t offset, size_t len, uint64_t iova, int *err) {
  fake *f = arg;
  ck_assert_int_eq(fd, 42);
  f->offset = offset;
  f->iova = iova;
  f->reg_len = len;
  f->reg_dmabuf_calls++;
  *err = f->dmabuf_err;
  return f->dmabuf_err ? NULL : &token_mr;
}
static int f_peermem(void *arg) {
  return ((fake *)arg)->peermem;
}
static void *f_reg_mr(void *arg, void *ptr, size_t len, int *err) {
  fake *f = arg;
  (void)ptr, (void)len;
  f->reg_mr_calls++;
  *err = f->mr_err;
  return f->mr_err ? NULL : &token_mr;
}
static void f_close(void *arg, int fd) {
  ck_assert_int_eq(fd, 42);
  ((fake *)arg)->fds_open--;
}

static hoop__gdr_kind decide(fake *f, int setting, char *why, void **mr) {
  hoop__gdr_ops ops = {f, f_attr, f_fd, f_reg_dmabuf, f_peermem, f_reg_mr, f_close};
  /* A buffer that starts and ends inside pages: 0x10000123, 5000 bytes. */
  return hoop__gdr_decide(&ops, setting, (void *)(uintptr_t)0x10000123u, 5000, 4096, mr, why, 512);
}

START_TEST(test_off) {
  fake f = {.attr = 1, .fd_ok = 1, .peermem = 1};
  char why[512];
  void *mr;
  ck_assert_int_eq(decide(&f, 0, why, &mr), HOOP__GDR_NONE);
  ck_assert_ptr_null(mr);
  ck_assert_msg(strstr(why, "HOOP_GDR=0") != NULL, "why: %s", why);
  ck_assert_int_eq(f.reg_dmabuf_calls + f.reg_mr_calls, 0);
}
END_TEST

START_TEST(test_dmabuf_taken_with_page_widened_range) {
  fake f = {.attr = 1, .fd_ok = 1, .peermem = 1};
  char why[512];
  void *mr;
  ck_assert_int_eq(decide(&f, -1, why, &mr), HOOP__GDR_DMABUF);
  ck_assert_ptr_eq(mr, &token_mr);
  /* [0x10000123, 0x100014ab) widened to [0x10000000, 0x10002000). */
  ck_assert_ptr_eq(f.fd_base, (void *)(uintptr_t)0x10000000u);
  ck_assert_uint_eq(f.fd_len, 0x2000);
  ck_assert_uint_eq(f.offset, 0x123);
  ck_assert_uint_eq(f.iova, 0x10000123u);
  ck_assert_uint_eq(f.reg_len, 5000);
  ck_assert_int_eq(f.fds_open, 0);
  ck_assert_int_eq(f.reg_mr_calls, 0);
  ck_assert_msg(strstr(why, "dma-buf") != NULL, "why: %s", why);
}
END_TEST

/* rxe's answer: the probe registration is unsupported; nvidia-peermem is not loaded either. */
START_TEST(test_dmabuf_unsupported_no_peermem) {
  fake f = {.attr = 1, .fd_ok = 1, .dmabuf_err = EOPNOTSUPP, .peermem = 0};
  char why[512];
  void *mr;
  ck_assert_int_eq(decide(&f, -1, why, &mr), HOOP__GDR_NONE);
  ck_assert_ptr_null(mr);
  ck_assert_int_eq(f.fds_open, 0);
  ck_assert_msg(strstr(why, "does not support dma-buf") && strstr(why, "nvidia-peermem is not"),
                "why: %s", why);
}
END_TEST

START_TEST(test_dmabuf_refused_then_peermem) {
  fake f = {.attr = 1, .fd_ok = 1, .dmabuf_err = EFAULT, .peermem = 1};
  char why[512];
  void *mr;
  ck_assert_int_eq(decide(&f, -1, why, &mr), HOOP__GDR_PEERMEM);
  ck_assert_ptr_eq(mr, &token_mr);
  ck_assert_int_eq(f.reg_dmabuf_calls, 1);
  ck_assert_int_eq(f.reg_mr_calls, 1);
  ck_assert_msg(strstr(why, "nvidia-peermem") != NULL, "why: %s", why);
}
END_TEST

START_TEST(test_no_attribute_peermem_refuses) {
  fake f = {.attr = 0, .peermem = 1, .mr_err = EFAULT};
  char why[512];
  void *mr;
  ck_assert_int_eq(decide(&f, -1, why, &mr), HOOP__GDR_NONE);
  ck_assert_int_eq(f.reg_dmabuf_calls, 0);
  ck_assert_msg(strstr(why, "does not support dma-buf") && strstr(why, "ibv_reg_mr of GPU memory"),
                "why: %s", why);
}
END_TEST

START_TEST(test_no_fd) {
  fake f = {.attr = -1, .peermem = 0};
  char why[512];
  void *mr;
  ck_assert_int_eq(decide(&f, 1, why, &mr), HOOP__GDR_NONE);
  ck_assert_msg(strstr(why, "cannot say") != NULL, "why: %s", why);
  fake g = {.attr = 1, .fd_ok = 0, .peermem = 0};
  ck_assert_int_eq(decide(&g, -1, why, &mr), HOOP__GDR_NONE);
  ck_assert_msg(strstr(why, "no dma-buf fd") && strstr(why, "no export"), "why: %s", why);
  ck_assert_int_eq(g.reg_dmabuf_calls, 0);
}
END_TEST

START_TEST(test_setting) {
  char why[128] = "";
  setenv("HOOP_GDR", "auto", 1);
  ck_assert_int_eq(hoop__gdr_setting(why, sizeof why), -1);
  setenv("HOOP_GDR", "0", 1);
  ck_assert_int_eq(hoop__gdr_setting(why, sizeof why), 0);
  setenv("HOOP_GDR", "1", 1);
  ck_assert_int_eq(hoop__gdr_setting(why, sizeof why), 1);
  setenv("HOOP_GDR", "yes", 1);
  ck_assert_int_eq(hoop__gdr_setting(why, sizeof why), -2);
  ck_assert_msg(strstr(why, "'yes'") != NULL, "why: %s", why);
  unsetenv("HOOP_GDR");
  ck_assert_int_eq(hoop__gdr_setting(why, sizeof why), -1);
}
END_TEST

int main(void) {
  Suite *s = suite_create("gdr");
  TCase *tc = tcase_create("decide");
  tcase_add_test(tc, test_off);
  tcase_add_test(tc, test_dmabuf_taken_with_page_widened_range);
  tcase_add_test(tc, test_dmabuf_unsupported_no_peermem);
  tcase_add_test(tc, test_dmabuf_refused_then_peermem);
  tcase_add_test(tc, test_no_attribute_peermem_refuses);
  tcase_add_test(tc, test_no_fd);
  tcase_add_test(tc, test_setting);
  suite_add_tcase(s, tc);
  SRunner *runner = srunner_create(s);
  srunner_run_all(runner, CK_NORMAL);
  int failed = srunner_ntests_failed(runner);
  srunner_free(runner);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
