/* Copies that do not depend on where the buffers lie (hpccl/csrc/_hotcore.c).

   On CPUs with fast "rep movsb", which glibc's memcpy uses from a few KiB to about 512 KiB and the kernel
   uses for every process_vm_readv/writev, a copy whose destination lies 1 to 32 bytes (mod 4096) after
   its source runs 10-20x slower than any other placement (measured on the CI machine's AMD EPYC under
   KVM: 37 us against 1.7 for 64 KiB; glibc bug 30994, fixed in glibc 2.39 for memcpy only;
   bench/placement/). Two buffers malloc'd back to back land exactly there (16 bytes of chunk header).
   hp_copy takes a vector loop for such pairs and memcpy for the rest; the reads between processes bounce
   through a buffer placed at the source's offset (_hotcore.c, cma_read). */
#ifndef HPCCL_COPY_H
#define HPCCL_COPY_H

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define HP_GAP_MAX 64 /* destination this many bytes (mod 4096) after the source, or fewer: a slow pair */

/* Whether copying src to dst would meet the slow placement. */
static inline int hp_bad_gap(const void *dst, const void *src) {
  uintptr_t g = ((uintptr_t)dst - (uintptr_t)src) & 4095;
  return g != 0 && g < HP_GAP_MAX;
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) static void hp_copy_avx2(char *dst, const char *src, size_t n) {
  size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    __m256i a = _mm256_loadu_si256((const __m256i *)(src + i));
    __m256i b = _mm256_loadu_si256((const __m256i *)(src + i + 32));
    __m256i c = _mm256_loadu_si256((const __m256i *)(src + i + 64));
    __m256i d = _mm256_loadu_si256((const __m256i *)(src + i + 96));
    _mm256_storeu_si256((__m256i *)(dst + i), a);
    _mm256_storeu_si256((__m256i *)(dst + i + 32), b);
    _mm256_storeu_si256((__m256i *)(dst + i + 64), c);
    _mm256_storeu_si256((__m256i *)(dst + i + 96), d);
  }
  if (i < n) memcpy(dst + i, src + i, n - i); /* under 128 bytes: no rep movsb */
}

static void hp_copy_sse2(char *dst, const char *src, size_t n) {
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m128i a = _mm_loadu_si128((const __m128i *)(src + i));
    __m128i b = _mm_loadu_si128((const __m128i *)(src + i + 16));
    __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32));
    __m128i d = _mm_loadu_si128((const __m128i *)(src + i + 48));
    _mm_storeu_si128((__m128i *)(dst + i), a);
    _mm_storeu_si128((__m128i *)(dst + i + 16), b);
    _mm_storeu_si128((__m128i *)(dst + i + 32), c);
    _mm_storeu_si128((__m128i *)(dst + i + 48), d);
  }
  if (i < n) memcpy(dst + i, src + i, n - i);
}
#endif

/* memcpy(dst, src, n) for buffers that do not overlap, at memcpy's speed whatever their placement. */
static inline void hp_copy(void *dst, const void *src, size_t n) {
#if defined(__x86_64__)
  if (n >= 2048 && hp_bad_gap(dst, src)) {
    if (__builtin_cpu_supports("avx2"))
      hp_copy_avx2((char *)dst, (const char *)src, n);
    else
      hp_copy_sse2((char *)dst, (const char *)src, n);
    return;
  }
#endif
  memcpy(dst, src, n);
}

/* memmove(dst, src, n): hp_copy unless the two overlap. */
static inline void hp_move(void *dst, const void *src, size_t n) {
  const char *d = (const char *)dst, *s = (const char *)src;
  if (d < s + n && s < d + n)
    memmove(dst, src, n);
  else
    hp_copy(dst, src, n);
}

#endif
