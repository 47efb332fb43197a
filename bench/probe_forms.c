/*
 * probe_forms.c — the bandwidth probe's streaming loop in several software
 * prefetch forms over one 1 GiB THP buffer, 2 threads (OpenMP), every form
 * once per round in rotated order; prints each form's best GB/s and its
 * median ratio to the old probe form (1 KB ahead to L1). The lab behind
 * 788f839 (the probe takes the fastest of three forms): bench/RESULTS.md,
 * 2026-12-01, "Prefetches to L2, a probe that is the best plain read".
 *
 *   cc -O2 -fopenmp -o /tmp/probe_forms bench/probe_forms.c
 *   /tmp/probe_forms [MiB] [rounds]       (defaults 1024 20)
 * x86-64 with AVX-512 only.
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
static double now_s(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+1e-9*t.tv_nsec;}
#define SUMF(NAME, PF, HINT) __attribute__((target("avx512f"))) static float NAME(const float *p, size_t n){ \
  __m512 a=_mm512_setzero_ps(),b=a,c=a,d=a; \
  for(size_t i=0;i+64<=n;i+=64){ \
    if (PF) for(int k=0;k<4;k++)_mm_prefetch((const char*)(p+i)+PF+64*k,HINT); \
    a=_mm512_add_ps(a,_mm512_load_ps(p+i));b=_mm512_add_ps(b,_mm512_load_ps(p+i+16)); \
    c=_mm512_add_ps(c,_mm512_load_ps(p+i+32));d=_mm512_add_ps(d,_mm512_load_ps(p+i+48));} \
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a,b),_mm512_add_ps(c,d)));}
SUMF(s_1k_t0,1024,_MM_HINT_T0)
SUMF(s_none,0,_MM_HINT_T0)
SUMF(s_4k_t0,4096,_MM_HINT_T0)
SUMF(s_4k_t1,4096,_MM_HINT_T1)
SUMF(s_2k_t0,2048,_MM_HINT_T0)
SUMF(s_1k_t1,1024,_MM_HINT_T1)
SUMF(s_2k_t1,2048,_MM_HINT_T1)
SUMF(s_8k_t1,8192,_MM_HINT_T1)
/* two streams per thread: halves of the slice interleaved */
__attribute__((target("avx512f"))) static float s_2str(const float *p, size_t n){
  __m512 a=_mm512_setzero_ps(),b=a,c=a,d=a; size_t h=n/2; const float*q=p+h;
  for(size_t i=0;i+32<=h;i+=32){
    _mm_prefetch((const char*)(p+i)+4096,_MM_HINT_T0);_mm_prefetch((const char*)(p+i)+4096+64,_MM_HINT_T0);
    _mm_prefetch((const char*)(q+i)+4096,_MM_HINT_T0);_mm_prefetch((const char*)(q+i)+4096+64,_MM_HINT_T0);
    a=_mm512_add_ps(a,_mm512_load_ps(p+i));b=_mm512_add_ps(b,_mm512_load_ps(p+i+16));
    c=_mm512_add_ps(c,_mm512_load_ps(q+i));d=_mm512_add_ps(d,_mm512_load_ps(q+i+16));}
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a,b),_mm512_add_ps(c,d)));}
typedef float (*fn_t)(const float*,size_t);
int main(int argc,char**argv){
  size_t mb=argc>1?atol(argv[1]):1024; int rounds=argc>2?atoi(argv[2]):20;
  size_t bytes=mb<<20, huge=2<<20;
  char*r=mmap(NULL,bytes+huge,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
  float*buf=(float*)(((uintptr_t)r+huge-1)&~(uintptr_t)(huge-1));
  madvise(buf,bytes,MADV_HUGEPAGE); memset(buf,1,bytes);
  fn_t fns[]={s_1k_t0,s_none,s_4k_t0,s_4k_t1,s_2k_t0,s_2str,s_1k_t1,s_2k_t1,s_8k_t1}; const char*names[]={"1k_t0(probe)","none","4k_t0","4k_t1","2k_t0","2str_4k","1k_t1","2k_t1","8k_t1"};
  int nf=9; size_t n=bytes/4; volatile float sink=0;
  double ratio[9][200]; double best[9]={0};
  omp_set_num_threads(2);
  for(int rd=0;rd<rounds;rd++){ double g[9];
    for(int k0=0;k0<nf;k0++){ int k=(k0+rd)%nf;
      double t0=now_s();
      #pragma omp parallel
      { int i=omp_get_thread_num(); size_t sl=n/2; float s=fns[k](buf+sl*i,sl); if(s==1234.5f)sink+=s; }
      g[k]=bytes/(now_s()-t0)/1e9; if(g[k]>best[k])best[k]=g[k];}
    for(int k=0;k<nf;k++) ratio[k][rd]=g[k]/g[0];
  }
  for(int k=0;k<nf;k++){ double*x=ratio[k]; for(int i=0;i<rounds;i++)for(int j=i+1;j<rounds;j++)if(x[j]<x[i]){double t=x[i];x[i]=x[j];x[j]=t;}
    printf("%-14s best %.1f GB/s  median ratio to probe %.3f (%.3f-%.3f)\n",names[k],best[k],x[rounds/2],x[0],x[rounds-1]);}
  return 0;}
