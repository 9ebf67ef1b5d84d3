/* copyalign.c -- does the placement of src/dst (offset mod 4096, THP, first touch) change the speed of
   (a) memcpy inside one process and (b) process_vm_readv from a forked peer process?
   Buffers are mmap'd page-aligned regions + an explicit offset, so placement is exact.
   Usage: copyalign MODE SIZE SRC_OFF DST_OFF [thp] [cold]
     MODE: memcpy | movsb (user-space rep movsb, what the kernel's copy_to_user uses with FSRM) | cma | avx (AVX2 load/store loop, no rep movsb)
           | cmabounce (process_vm_readv in 64 KiB pieces into a scratch at the source's offset mod 4096,
             then the avx copy to dst: what a placement-proof direct path could do)      thp: madvise(MADV_HUGEPAGE) both regions    cold: fresh mmap each rep (first touch)
   Prints: median us, GB/s, minor faults per rep.  Build: cc -O2 -o copyalign copyalign.c */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <immintrin.h>

/* Copy with 32-byte AVX2 loads/stores: immune to the rep movsb slow window. */
__attribute__((target("avx2"))) static void avx_copy(char *d, const char *s, size_t n) {
  size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    __m256i a = _mm256_loadu_si256((const __m256i *)(s + i)), b = _mm256_loadu_si256((const __m256i *)(s + i + 32));
    __m256i c = _mm256_loadu_si256((const __m256i *)(s + i + 64)), e = _mm256_loadu_si256((const __m256i *)(s + i + 96));
    _mm256_storeu_si256((__m256i *)(d + i), a), _mm256_storeu_si256((__m256i *)(d + i + 32), b);
    _mm256_storeu_si256((__m256i *)(d + i + 64), c), _mm256_storeu_si256((__m256i *)(d + i + 96), e);
  }
  for (; i < n; i++) d[i] = s[i];
}

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int cmp(const void *a, const void *b) { double x = *(double *)a, y = *(double *)b; return x < y ? -1 : x > y; }
static char *region(size_t len, int thp) {
  /* 2 MiB-aligned so THP can back it */
  size_t al = 2 << 20;
  char *p = mmap(NULL, len + al, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) { perror("mmap"); exit(1); }
  char *q = (char *)(((unsigned long)p + al - 1) & ~(al - 1));
  if (thp) madvise(q, len, MADV_HUGEPAGE);
  return q;
}
static long minflt(void) { struct rusage u; getrusage(RUSAGE_SELF, &u); return u.ru_minflt; }

int main(int argc, char **argv) {
  if (argc < 5) { fprintf(stderr, "usage\n"); return 2; }
  int cma = !strcmp(argv[1], "cma"), movsb = !strcmp(argv[1], "movsb"), avx = !strcmp(argv[1], "avx"), bounce = !strcmp(argv[1], "cmabounce");
  cma |= bounce;
  char *scr = region(65536 + 4096, 0); memset(scr, 0, 65536 + 4096);
  size_t n = strtoul(argv[2], 0, 0), so = strtoul(argv[3], 0, 0), dof = strtoul(argv[4], 0, 0);
  int thp = 0, cold = 0;
  for (int i = 5; i < argc; i++) thp |= !strcmp(argv[i], "thp"), cold |= !strcmp(argv[i], "cold");
  size_t rl = n + 8192;
  char *src = region(rl, thp) + so;
  memset(src, 1, n);
  pid_t child = 0;
  if (cma) { /* the peer owns src: write it after fork so it has its own pages, then wait to be killed */
    int pp[2]; pipe(pp);
    child = fork();
    if (child == 0) { memset(src, 2, n); write(pp[1], "x", 1); pause(); _exit(0); }
    char c; read(pp[0], &c, 1);
  }
  int reps = (int)(200e6 / n); if (reps > 2000) reps = 2000; if (reps < 20) reps = 20;
  if (cold && reps > 200) reps = 200;
  double *t = malloc(reps * sizeof *t);
  char *dst = cold ? NULL : region(rl, thp) + dof;
  if (!cold) memset(dst, 0, n);
  long f0 = minflt();
  for (int i = 0; i < reps + 3; i++) {
    char *base = NULL;
    if (cold) { base = region(rl, thp); dst = base + dof; }
    double t0 = now();
    if (bounce) {
      char *b = scr + ((uintptr_t)src & 4095); /* (b - src) % 4096 == 0: the kernel's rep movsb runs fast */
      for (size_t o = 0; o < n; o += 65536) {
        size_t l = n - o < 65536 ? n - o : 65536;
        struct iovec lv = {b, l}, rv = {src + o, l};
        if (process_vm_readv(child, &lv, 1, &rv, 1, 0) != (ssize_t)l) { perror("readv"); return 1; }
        avx_copy(dst + o, b, l);
      }
    } else if (avx) avx_copy(dst, src, n);
    else if (cma) {
      struct iovec l = {dst, n}, r = {src, n};
      if (process_vm_readv(child, &l, 1, &r, 1, 0) != (ssize_t)n) { perror("readv"); return 1; }
    } else if (movsb) {
      void *d = dst, *s = src; size_t c = n;
      __asm__ volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(c) : : "memory");
    } else memcpy(dst, src, n);
    double dt = now() - t0;
    if (i >= 3) t[i - 3] = dt;
    if (cold) munmap(base - 0, rl); /* region() leaked the alignment slack; fine for a benchmark */
  }
  long f1 = minflt();
  qsort(t, reps, sizeof *t, cmp);
  double med = t[reps / 2];
  printf("%-6s %8zu src%%4096=%-4zu dst%%4096=%-4zu (d-s)%%4096=%-4zu %s%s %9.1f us %6.2f GB/s flt/rep %.1f\n",
         argv[1], n, so, dof, (dof - so) & 4095, thp ? "thp " : "", cold ? "cold" : "warm", med * 1e6, n / med / 1e9,
         (double)(f1 - f0) / (reps + 3));
  if (child) { kill(child, SIGKILL); waitpid(child, 0, 0); }
  return 0;
}
