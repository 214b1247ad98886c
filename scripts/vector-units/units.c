// Throughput and latency of the AVX-512 instructions cryptblk's sector engines are made
// of, on this CPU: which execution units they share decides how fast AES-GCM and
// AEGIS-128 can be beside AES-XTS. Cycles are counted against a chain of dependent
// integer adds (one a cycle) timed once at the start: a core that clocks differently
// under AVX-512 work skews every figure alike, not their ratios.
//   scripts/vector-units/run.sh
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define N 20000000L
// Keeps a value in a register and its computation alive.
#define KEEP(x) __asm__ volatile("" : "+v"(x))

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static double ghz;

static void clock_rate(void) {
  double t0 = now();
  uint64_t x = 1;
  for (long i = 0; i < N * 5; i++)
    __asm__ volatile("add $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0" : "+r"(x));
  ghz = 4.0 * N * 5 / (now() - t0) / 1e9;
}

#define TIME(label, per, unit, body)                                          \
  do {                                                                        \
    double t0 = now();                                                        \
    for (long i = 0; i < N; i++) { body; }                                    \
    double c = (now() - t0) * ghz * 1e9 / N;                                  \
    printf("| %-54s | %6.2f %s |\n", label, (per) > 0 ? (per) / c : c, unit); \
  } while (0)

#define AES(a) a = _mm512_aesenc_epi128(a, k);
#define SHUF(a) a = _mm512_shuffle_i64x2(a, k, 0x88);
#define CLMUL(a) a = _mm512_clmulepi64_epi128(a, k, 0x10);
#define AES8 AES(a0) AES(a1) AES(a2) AES(a3) AES(a4) AES(a5) AES(a6) AES(a7)
#define KEEPA KEEP(a0); KEEP(a1); KEEP(a2); KEEP(a3); KEEP(a4); KEEP(a5); KEEP(a6); KEEP(a7);
#define KEEPD KEEP(d0); KEEP(d1); KEEP(d2); KEEP(d3); KEEP(d4); KEEP(d5); KEEP(d6); KEEP(d7);

// One AEGIS-128 state update on the five registers p0..p4, message m.
#define AEGIS(p, m)                                   \
  {                                                   \
    __m512i t = p##4;                                 \
    p##4 = _mm512_aesenc_epi128(p##3, p##4);          \
    p##3 = _mm512_aesenc_epi128(p##2, p##3);          \
    p##2 = _mm512_aesenc_epi128(p##1, p##2);          \
    p##1 = _mm512_aesenc_epi128(p##0, p##1);          \
    p##0 = _mm512_xor_si512(_mm512_aesenc_epi128(t, p##0), m); \
  }
#define KEEPS(p) KEEP(p##0); KEEP(p##1); KEEP(p##2); KEEP(p##3); KEEP(p##4);

static char buf[16384] __attribute__((aligned(64)));

int main(void) {
  clock_rate();
  printf("core clock ~%.2f GHz (dependent adds)\n\n", ghz);
  printf("| what | figure |\n|---|---|\n");
  __m512i k = _mm512_set1_epi32(5), m = _mm512_set1_epi32(9);
  __m512i a0 = _mm512_set1_epi32(1), a1 = _mm512_set1_epi32(2), a2 = _mm512_set1_epi32(3),
          a3 = _mm512_set1_epi32(4), a4 = _mm512_set1_epi32(5), a5 = _mm512_set1_epi32(6),
          a6 = _mm512_set1_epi32(7), a7 = _mm512_set1_epi32(8);
  __m512i d0 = a0, d1 = a1, d2 = a2, d3 = a3, d4 = a4, d5 = a5, d6 = a6, d7 = a7;
  TIME("VAESENC zmm, 8 independent", 8, "a cycle", AES8 KEEPA);
  TIME("VAESENC zmm, one dependent chain (latency)", 0, "cycles",
       AES(a0) KEEP(a0));
  TIME("VAESENC then VPXORQ, one chain (latency)", 0, "cycles",
       a0 = _mm512_xor_si512(_mm512_aesenc_epi128(a0, k), m); KEEP(a0));
  TIME("VSHUFI64X2 zmm, 8 independent", 8, "a cycle",
       SHUF(d0) SHUF(d1) SHUF(d2) SHUF(d3) SHUF(d4) SHUF(d5) SHUF(d6) SHUF(d7) KEEPD);
  TIME("VPCLMULQDQ zmm, 8 independent", 8, "a cycle",
       CLMUL(d0) CLMUL(d1) CLMUL(d2) CLMUL(d3) CLMUL(d4) CLMUL(d5) CLMUL(d6) CLMUL(d7) KEEPD);
  TIME("8 VAESENC alone", 0, "cycles", AES8 KEEPA);
  TIME("8 VAESENC + 4 VSHUFI64X2 (shared units: 6 if shared)", 0, "cycles",
       AES8 SHUF(d0) SHUF(d1) SHUF(d2) SHUF(d3) KEEPA KEEPD);
  TIME("8 VAESENC + 4 VPCLMULQDQ (apart: 8, the multiplier's)", 0, "cycles",
       AES8 CLMUL(d0) CLMUL(d1) CLMUL(d2) CLMUL(d3) KEEPA KEEPD);
  __m512i b0 = a1, b1 = a2, b2 = a3, b3 = a4, b4 = a0, c0 = a2, c1 = a3, c2 = a4, c3 = a0, c4 = a1;
  TIME("AEGIS-128 update, 1 state (4 sectors): cycles a step", 0, "cycles",
       AEGIS(a, m) KEEPS(a));
  TIME("AEGIS-128 update, 2 states (8 sectors): VAESENC", 10, "a cycle",
       AEGIS(a, m) AEGIS(b, m) KEEPS(a) KEEPS(b));
  TIME("AEGIS-128 update, 3 states (12 sectors): VAESENC", 15, "a cycle",
       AEGIS(a, m) AEGIS(b, m) AEGIS(c, m) KEEPS(a) KEEPS(b) KEEPS(c));
  char *p = buf + 8;
  TIME("memset of 7 KiB (glibc)", 0, "cycles",
       memset(p, 0, 7168); __asm__ volatile("" ::"r"(p) : "memory"));
  TIME("7 KiB zeroed 64 bytes a store", 0, "cycles", {
    __m512i z = _mm512_setzero_si512();
    for (int o = 0; o < 7168; o += 64) _mm512_storeu_si512(p + o, z);
    __asm__ volatile("" ::"r"(p) : "memory");
  });
  return 0;
}
