// Whether SHA-NI (one message at a time, its own unit) can run beside cryptblk's sixteen
// AVX-512 SHA-256 lanes: a lane block (a SHA-256-shaped round on sixteen 32-bit lanes,
// with its message schedule) alone, two sets of lanes interleaved, one SHA-NI block
// alone, and lanes and SHA-NI interleaved, one or two SHA-NI streams doing 1-4
// quad-rounds after every fourth lane round. Timing only:
// the values computed are not SHA-256 of anything. Cycles against a chain of dependent
// adds timed once at the start.
//   scripts/vector-units/run.sh
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
#include <stdint.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define K(x) __asm__ volatile("" : "+v"(x))
// 16-lane SHA-256 round (AVX-512, one message a 32-bit lane)
#define ROR(x,n) _mm512_ror_epi32(x,n)
typedef struct { __m512i a,b,c,d,e,f,g,h; } L;
static inline __attribute__((always_inline)) void lane_round(L* s, __m512i kw){
  __m512i S1=_mm512_ternarylogic_epi32(ROR(s->e,6),ROR(s->e,11),ROR(s->e,25),0x96);
  __m512i ch=_mm512_ternarylogic_epi32(s->e,s->f,s->g,0xca);
  // Reassociated as the engine does: the new e three steps from the old.
  __m512i t1p=_mm512_add_epi32(_mm512_add_epi32(s->h,kw),ch);
  __m512i t1=_mm512_add_epi32(t1p,S1);
  __m512i S0=_mm512_ternarylogic_epi32(ROR(s->a,2),ROR(s->a,13),ROR(s->a,22),0x96);
  __m512i mj=_mm512_ternarylogic_epi32(s->a,s->b,s->c,0xe8);
  __m512i t2=_mm512_add_epi32(S0,mj);
  s->h=s->g; s->g=s->f; s->f=s->e; s->e=_mm512_add_epi32(_mm512_add_epi32(s->d,t1p),S1);
  s->d=s->c; s->c=s->b; s->b=s->a; s->a=_mm512_add_epi32(t1,t2);
}
// message schedule step for lanes: w16 = s1(w14)+w9+s0(w1)+w0
static inline __attribute__((always_inline)) __m512i lsched(__m512i w0,__m512i w1,__m512i w9,__m512i w14){
  __m512i s0=_mm512_ternarylogic_epi32(ROR(w1,7),ROR(w1,18),_mm512_srli_epi32(w1,3),0x96);
  __m512i s1=_mm512_ternarylogic_epi32(ROR(w14,17),ROR(w14,19),_mm512_srli_epi32(w14,10),0x96);
  return _mm512_add_epi32(_mm512_add_epi32(w0,w9),_mm512_add_epi32(s0,s1));
}
// SHA-NI: one quad-round (4 rounds) with schedule
typedef struct { __m128i s0,s1,m0,m1,m2,m3; } N;
static inline __attribute__((always_inline)) void nquad(N* n, __m128i k){
  __m128i msg=_mm_add_epi32(n->m0,k);
  n->s1=_mm_sha256rnds2_epu32(n->s1,n->s0,msg);
  msg=_mm_shuffle_epi32(msg,0x0e);
  n->s0=_mm_sha256rnds2_epu32(n->s0,n->s1,msg);
  __m128i t=_mm_add_epi32(_mm_sha256msg1_epu32(n->m0,n->m1),_mm_alignr_epi8(n->m3,n->m2,4));
  __m128i nm=_mm_sha256msg2_epu32(t,n->m3);
  n->m0=n->m1; n->m1=n->m2; n->m2=n->m3; n->m3=nm;
}
#define R 2000000L
int main(){
  double t0=now(); uint64_t x=1; for(long i=0;i<100000000;i++){ __asm__ volatile("add $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0":"+r"(x)); } double ghz=4e8/(now()-t0)/1e9;
  printf("GHz ~ %.2f\n",ghz);
  L s; s.a=_mm512_set1_epi32(1);s.b=_mm512_set1_epi32(2);s.c=_mm512_set1_epi32(3);s.d=_mm512_set1_epi32(4);s.e=_mm512_set1_epi32(5);s.f=_mm512_set1_epi32(6);s.g=_mm512_set1_epi32(7);s.h=_mm512_set1_epi32(8);
  __m512i w[16]; for(int i=0;i<16;i++) w[i]=_mm512_set1_epi32(i*3+1);
  N n1,n2; n1.s0=_mm_set1_epi32(1);n1.s1=_mm_set1_epi32(2);n1.m0=_mm_set1_epi32(3);n1.m1=_mm_set1_epi32(4);n1.m2=_mm_set1_epi32(5);n1.m3=_mm_set1_epi32(6); n2=n1; n2.s0=_mm_set1_epi32(9);
  __m128i kk=_mm_set1_epi32(0x428a2f98); __m512i kz=_mm512_set1_epi32(0x428a2f98);
  // one lane block: 64 rounds (48 with schedule)
#define LBLOCK(EXTRA) for(int r=0;r<64;r++){ __m512i wr; if(r<16) wr=w[r]; else { wr=lsched(w[r&15],w[(r+1)&15],w[(r+9)&15],w[(r+14)&15]); w[r&15]=wr; } lane_round(&s,_mm512_add_epi32(wr,kz)); EXTRA }
  t0=now(); for(long i=0;i<R;i++){ LBLOCK() K(s.a);K(s.e); } double lane=(now()-t0)*ghz*1e9/R;
  printf("16-lane block (16 x 64 B): %.0f cycles\n", lane);
  t0=now(); for(long i=0;i<R;i++){ for(int q=0;q<16;q++) nquad(&n1,kk); K(n1.s0);K(n1.s1);} double ni=(now()-t0)*ghz*1e9/R;
  printf("SHA-NI block (1 x 64 B), one stream: %.0f cycles\n", ni);
  t0=now(); for(long i=0;i<R;i++){ for(int q=0;q<16;q++){ nquad(&n1,kk); nquad(&n2,kk);} K(n1.s0);K(n1.s1);K(n2.s0);K(n2.s1);} double ni2=(now()-t0)*ghz*1e9/R;
  printf("SHA-NI, two streams, a block each: %.0f cycles\n", ni2);
  // Two sets of sixteen lanes, their rounds interleaved (the engine's compress2): one
  // set's rounds are a single chain of dependent steps.
  { L s2=s; s2.a=_mm512_set1_epi32(11); __m512i w2[16]; for(int i=0;i<16;i++) w2[i]=_mm512_set1_epi32(i*5+1);
    t0=now(); for(long i=0;i<R;i++){ for(int r=0;r<64;r++){ __m512i wr,wr2; if(r<16){ wr=w[r]; wr2=w2[r]; } else { wr=lsched(w[r&15],w[(r+1)&15],w[(r+9)&15],w[(r+14)&15]); w[r&15]=wr; wr2=lsched(w2[r&15],w2[(r+1)&15],w2[(r+9)&15],w2[(r+14)&15]); w2[r&15]=wr2; } lane_round(&s,_mm512_add_epi32(wr,kz)); lane_round(&s2,_mm512_add_epi32(wr2,kz)); } K(s.a);K(s.e);K(s2.a);K(s2.e);} double two=(now()-t0)*ghz*1e9/R;
    printf("two 16-lane sets interleaved (32 blocks): %.0f cycles, %.2f blocks/kcycle vs one set %.2f\n", two, 32/two*1000, 16/lane*1000);
    __m512i o2=_mm512_add_epi32(s2.a,s2.e); K(o2); }
  for(int per=1; per<=4; per++){
    t0=now(); for(long i=0;i<R;i++){ LBLOCK(if((r&3)==3){ for(int q=0;q<per;q++) nquad(&n1,kk);}) K(s.a);K(s.e);K(n1.s0);K(n1.s1);} double h=(now()-t0)*ghz*1e9/R;
    double blocks=16+per; printf("lanes + %d SHA-NI quad-round(s) every 4 lane rounds (one stream, %d blocks): %.0f cycles, %.2f blocks/kcycle vs lanes %.2f\n", per, per, h, blocks/h*1000, 16/lane*1000);
    t0=now(); for(long i=0;i<R;i++){ LBLOCK(if((r&3)==3){ for(int q=0;q<per;q++){ nquad(&n1,kk); nquad(&n2,kk);}}) K(s.a);K(s.e);K(n1.s0);K(n1.s1);K(n2.s0);K(n2.s1);} h=(now()-t0)*ghz*1e9/R;
    blocks=16+2*per; printf("lanes + 2 streams x %d: %.0f cycles, %.2f blocks/kcycle\n", per, h, blocks/h*1000);
  }
  __m512i o=_mm512_add_epi32(s.a,s.e); K(o); __m128i p=_mm_add_epi32(n1.s0,n2.s1); K(p);
}
