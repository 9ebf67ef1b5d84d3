/* cmalog.c -- LD_PRELOAD shim: histogram of the process_vm_readv/writev calls a process makes, by
   (dst - src) % 4096 (dst: where the bytes land), written to stderr at exit. Shows which copies of hpccl
   and MPICH fall in the slow window of rep movsb on this CPU ((dst - src) % 4096 in 1..32).
   Build: cc -O2 -shared -fPIC -o /tmp/cmalog.so cmalog.c -ldl    Use: LD_PRELOAD=/tmp/cmalog.so prog */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/uio.h>
#include <unistd.h>

typedef ssize_t (*fn_t)(pid_t, const struct iovec *, unsigned long, const struct iovec *, unsigned long, unsigned long);
static long hist[2][4096], bytes[2][4096];
static void rec(int w, const struct iovec *l, unsigned long nl, const struct iovec *r, unsigned long nr) {
  if (nl == 1 && nr == 1) { /* hpccl and MPICH pass one iovec each side */
    uintptr_t d = (uintptr_t)(w ? r->iov_base : l->iov_base), s = (uintptr_t)(w ? l->iov_base : r->iov_base);
    hist[w][(d - s) & 4095]++, bytes[w][(d - s) & 4095] += l->iov_len;
  }
}
ssize_t process_vm_readv(pid_t p, const struct iovec *l, unsigned long nl, const struct iovec *r, unsigned long nr, unsigned long f) {
  static fn_t real; if (!real) real = (fn_t)dlsym(RTLD_NEXT, "process_vm_readv");
  rec(0, l, nl, r, nr); return real(p, l, nl, r, nr, f);
}
ssize_t process_vm_writev(pid_t p, const struct iovec *l, unsigned long nl, const struct iovec *r, unsigned long nr, unsigned long f) {
  static fn_t real; if (!real) real = (fn_t)dlsym(RTLD_NEXT, "process_vm_writev");
  rec(1, l, nl, r, nr); return real(p, l, nl, r, nr, f);
}
__attribute__((destructor)) static void dump(void) {
  for (int w = 0; w < 2; w++) for (int k = 0; k < 4096; k++) if (bytes[w][k] >= 65536)
    fprintf(stderr, "cmalog pid %d %s (dst-src)%%4096=%4d calls %6ld bytes %10ld%s\n", getpid(), w ? "writev" : "readv", k,
            hist[w][k], bytes[w][k], k >= 1 && k <= 32 ? "  <-- slow window" : "");
}
