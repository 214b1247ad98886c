// Single-core speed of Linux 6.12's x86 AES-GCM assembly (arch/x86/crypto/
// aes-gcm-aesni-x86_64.S and aes-gcm-avx10-x86_64.S, assembled unchanged from Debian's
// linux-source package by run.sh) on this CPU, in userspace, called as dm-crypt's
// aes-gcm-random mode calls the kernel's gcm(aes): one request per sector, a 12-byte
// random IV, 20 bytes of associated data (the sector number, little-endian, then the
// IV), a 16-byte tag. No kernel around it (no kernel_fpu_begin/end, no scatterlist
// walk, no bio): the figure favours the kernel.
//
// Every driver is first checked against OpenSSL's aes-256-gcm. Output: one line per
// driver x sector size x direction: MB/s (10^6 B/s of data) and ns per sector.
#include <openssl/evp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// The layouts the assembly expects (aesni-intel_glue.c checks the same offsets).
struct crypto_aes_ctx {
    uint32_t key_enc[60], key_dec[60], key_length;
};
struct aes_gcm_key {
    struct crypto_aes_ctx aes_key;
    uint32_t rfc4106_nonce;
};
struct aes_gcm_key_aesni {
    struct aes_gcm_key base;
    uint64_t h_powers[8][2] __attribute__((aligned(16)));
    uint64_t h_powers_xored[8] __attribute__((aligned(16)));
    uint64_t h_times_x64[2] __attribute__((aligned(16)));
};
struct aes_gcm_key_avx10 {
    struct aes_gcm_key base;
    uint64_t h_powers[16][2] __attribute__((aligned(64)));
    uint64_t padding[3][2];
};
_Static_assert(offsetof(struct aes_gcm_key_aesni, base.aes_key.key_length) == 480, "layout");
_Static_assert(offsetof(struct aes_gcm_key_aesni, h_powers) == 496, "layout");
_Static_assert(offsetof(struct aes_gcm_key_aesni, h_powers_xored) == 624, "layout");
_Static_assert(offsetof(struct aes_gcm_key_aesni, h_times_x64) == 688, "layout");
_Static_assert(offsetof(struct aes_gcm_key_avx10, h_powers) == 512, "layout");
_Static_assert(offsetof(struct aes_gcm_key_avx10, padding) == 768, "layout");

void aesni_set_key(struct crypto_aes_ctx *ctx, const uint8_t *key, unsigned len);
#define GCM_FNS(s, K)                                                                          \
    void aes_gcm_precompute_##s(K *key);                                                       \
    void aes_gcm_enc_update_##s(const K *, const uint32_t le_ctr[4], uint8_t acc[16],           \
                                const uint8_t *src, uint8_t *dst, int len);                    \
    void aes_gcm_dec_update_##s(const K *, const uint32_t le_ctr[4], uint8_t acc[16],           \
                                const uint8_t *src, uint8_t *dst, int len);
GCM_FNS(aesni, struct aes_gcm_key_aesni)
GCM_FNS(aesni_avx, struct aes_gcm_key_aesni)
GCM_FNS(vaes_avx10_256, struct aes_gcm_key_avx10)
GCM_FNS(vaes_avx10_512, struct aes_gcm_key_avx10)
#define GCM_COMMON(s, K)                                                                       \
    void aes_gcm_aad_update_##s(const K *, uint8_t acc[16], const uint8_t *aad, int len);      \
    void aes_gcm_enc_final_##s(const K *, const uint32_t le_ctr[4], uint8_t acc[16],            \
                               uint64_t aadlen, uint64_t datalen);                             \
    bool aes_gcm_dec_final_##s(const K *, const uint32_t le_ctr[4], const uint8_t acc[16],      \
                               uint64_t aadlen, uint64_t datalen, const uint8_t tag[16],       \
                               int taglen);
GCM_COMMON(aesni, struct aes_gcm_key_aesni)
GCM_COMMON(aesni_avx, struct aes_gcm_key_aesni)
GCM_COMMON(vaes_avx10, struct aes_gcm_key_avx10)

typedef void (*update_fn)(const void *, const uint32_t *, uint8_t *, const uint8_t *, uint8_t *, int);
typedef void (*aad_fn)(const void *, uint8_t *, const uint8_t *, int);
typedef void (*enc_final_fn)(const void *, const uint32_t *, uint8_t *, uint64_t, uint64_t);
typedef bool (*dec_final_fn)(const void *, const uint32_t *, const uint8_t *, uint64_t, uint64_t,
                             const uint8_t *, int);

static struct impl {
    const char *driver;   // the kernel's driver name (/proc/crypto)
    void *key;            // a key of the layout the driver needs
    void (*precompute)(void *);
    aad_fn aad;
    update_fn enc, dec;
    enc_final_fn enc_final;
    dec_final_fn dec_final;
    const char *const *features;
} impls[4];

static struct aes_gcm_key_aesni key_aesni __attribute__((aligned(64)));
static struct aes_gcm_key_avx10 key_avx10 __attribute__((aligned(64)));

static const char *const F_AESNI[] = {"aes", "pclmul", NULL};
static const char *const F_AVX[] = {"aes", "pclmul", "avx", NULL};
static const char *const F_AVX10[] = {"aes", "avx2", "vaes", "vpclmulqdq", "avx512bw", "avx512vl", "bmi2", NULL};

static bool usable(const char *const *f) {
    for (; *f; f++) {
        bool ok = !strcmp(*f, "aes") ? __builtin_cpu_supports("aes")
                : !strcmp(*f, "pclmul") ? __builtin_cpu_supports("pclmul")
                : !strcmp(*f, "avx") ? __builtin_cpu_supports("avx")
                : !strcmp(*f, "avx2") ? __builtin_cpu_supports("avx2")
                : !strcmp(*f, "vaes") ? __builtin_cpu_supports("vaes")
                : !strcmp(*f, "vpclmulqdq") ? __builtin_cpu_supports("vpclmulqdq")
                : !strcmp(*f, "avx512bw") ? __builtin_cpu_supports("avx512bw")
                : !strcmp(*f, "avx512vl") ? __builtin_cpu_supports("avx512vl")
                : !strcmp(*f, "bmi2") ? __builtin_cpu_supports("bmi2") : false;
        if (!ok) return false;
    }
    return true;
}

#define IMPL(name, k, s, common, feat)                                                         \
    (struct impl) { name, &k, (void (*)(void *))aes_gcm_precompute_##s,                        \
                    (aad_fn)aes_gcm_aad_update_##common, (update_fn)aes_gcm_enc_update_##s,    \
                    (update_fn)aes_gcm_dec_update_##s, (enc_final_fn)aes_gcm_enc_final_##common, \
                    (dec_final_fn)aes_gcm_dec_final_##common, feat }

// dm-crypt's aes-gcm-random sector: IV = 12 random bytes (from the sector's metadata),
// associated data = le64(sector in 512-byte units) || IV, tag after the data.
static void aad_of(uint8_t aad[20], uint64_t sector, const uint8_t iv[12]) {
    memcpy(aad, &sector, 8);
    memcpy(aad + 8, iv, 12);
}
static void ctr_of(uint32_t le_ctr[4], const uint8_t iv[12]) {
    le_ctr[0] = 2;   // counter block 1 encrypts the tag
    le_ctr[1] = (uint32_t)iv[8] << 24 | iv[9] << 16 | iv[10] << 8 | iv[11];
    le_ctr[2] = (uint32_t)iv[4] << 24 | iv[5] << 16 | iv[6] << 8 | iv[7];
    le_ctr[3] = (uint32_t)iv[0] << 24 | iv[1] << 16 | iv[2] << 8 | iv[3];
}
static void seal(struct impl *im, uint64_t sector, const uint8_t iv[12], const uint8_t *src,
                 uint8_t *dst, unsigned len, uint8_t tag[16]) {
    uint8_t aad[20], acc[16] = {0};
    uint32_t le_ctr[4];
    aad_of(aad, sector, iv);
    ctr_of(le_ctr, iv);
    im->aad(im->key, acc, aad, 20);
    im->enc(im->key, le_ctr, acc, src, dst, (int)len);
    im->enc_final(im->key, le_ctr, acc, 20, len);
    memcpy(tag, acc, 16);
}
static bool open_(struct impl *im, uint64_t sector, const uint8_t iv[12], const uint8_t *src,
                  uint8_t *dst, unsigned len, const uint8_t tag[16]) {
    uint8_t aad[20], acc[16] = {0};
    uint32_t le_ctr[4];
    aad_of(aad, sector, iv);
    ctr_of(le_ctr, iv);
    im->aad(im->key, acc, aad, 20);
    im->dec(im->key, le_ctr, acc, src, dst, (int)len);
    return im->dec_final(im->key, le_ctr, acc, 20, len, tag, 16);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    double secs = argc > 1 ? atof(argv[1]) : 1.0;
    const size_t buf = 1 << 20;   // 1 MiB working set, as xts-bench and cryptblk benchmark
    uint8_t key[32];
    uint8_t *src = aligned_alloc(64, buf), *dst = aligned_alloc(64, buf);
    uint8_t *ref = aligned_alloc(64, buf), *chk = aligned_alloc(64, buf);
    uint8_t *tags = malloc(buf / 512 * 16), *ref_tags = malloc(buf / 512 * 16), *ivs = malloc(buf / 512 * 12);
    for (size_t i = 0; i < sizeof key; i++) key[i] = (uint8_t)(i * 7 + 1);
    for (size_t i = 0; i < buf; i++) src[i] = (uint8_t)(i * 131 + 7);
    for (size_t i = 0; i < buf / 512 * 12; i++) ivs[i] = (uint8_t)(i * 37 + 11);
    impls[0] = IMPL("generic-gcm-aesni", key_aesni, aesni, aesni, F_AESNI);
    impls[1] = IMPL("generic-gcm-aesni-avx", key_aesni, aesni_avx, aesni_avx, F_AVX);
    impls[2] = IMPL("generic-gcm-vaes-avx10_256", key_avx10, vaes_avx10_256, vaes_avx10, F_AVX10);
    impls[3] = IMPL("generic-gcm-vaes-avx10_512", key_avx10, vaes_avx10_512, vaes_avx10, F_AVX10);

    // Reference: OpenSSL aes-256-gcm over 4096-byte sectors, as dm-crypt builds them.
    EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
    for (size_t off = 0, s = 0; off < buf; off += 4096, s++) {
        uint8_t aad[20];
        int outl;
        aad_of(aad, off / 512, ivs + s * 12);
        EVP_EncryptInit_ex(c, EVP_aes_256_gcm(), NULL, key, ivs + s * 12);
        EVP_EncryptUpdate(c, NULL, &outl, aad, 20);
        EVP_EncryptUpdate(c, ref + off, &outl, src + off, 4096);
        EVP_EncryptFinal_ex(c, ref + off, &outl);
        EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, 16, ref_tags + s * 16);
    }
    EVP_CIPHER_CTX_free(c);

    printf("%-28s %6s %4s %10s %12s\n", "driver", "sector", "dir", "MB/s", "ns/sector");
    for (size_t n = 0; n < sizeof impls / sizeof impls[0]; n++) {
        struct impl *im = &impls[n];
        if (!usable(im->features)) { printf("%-28s  (CPU lacks the required features)\n", im->driver); continue; }
        struct crypto_aes_ctx *aes = im->key;
        aesni_set_key(aes, key, sizeof key);
        im->precompute(im->key);
        bool good = true;
        for (size_t off = 0, s = 0; off < buf; off += 4096, s++) {
            seal(im, off / 512, ivs + s * 12, src + off, dst + off, 4096, tags + s * 16);
            good &= open_(im, off / 512, ivs + s * 12, dst + off, chk + off, 4096, tags + s * 16);
        }
        good = good && !memcmp(dst, ref, buf) && !memcmp(chk, src, buf) &&
               !memcmp(tags, ref_tags, buf / 4096 * 16);
        dst[100] ^= 1;
        good &= !open_(im, 0, ivs, dst, chk, 4096, tags);   // a changed byte must fail
        dst[100] ^= 1;
        if (!good) {
            printf("%-28s  MISMATCH against OpenSSL: not measured\n", im->driver);
            continue;
        }
        for (unsigned ss = 512; ss <= 4096; ss *= 8) {
            for (int enc = 1; enc >= 0; enc--) {
                uint64_t sectors = 0;
                bool ok = true;
                // Opening measures what the previous seal wrote.
                for (size_t off = 0, s = 0; off < buf; off += ss, s++)
                    seal(im, off / 512, ivs + s * 12, src + off, dst + off, ss, tags + s * 16);
                double t0 = now(), t;
                do {
                    for (size_t off = 0, s = 0; off < buf; off += ss, s++) {
                        if (enc) seal(im, off / 512, ivs + s * 12, src + off, dst + off, ss, tags + s * 16);
                        else ok &= open_(im, off / 512, ivs + s * 12, dst + off, chk + off, ss, tags + s * 16);
                    }
                    sectors += buf / ss;
                } while ((t = now() - t0) < secs);
                if (!ok) { printf("%-28s  a tag failed while measuring\n", im->driver); return 1; }
                printf("%-28s %6u %4s %10.0f %12.1f\n", im->driver, ss, enc ? "seal" : "open",
                       sectors * ss / t / 1e6, t * 1e9 / sectors);
            }
        }
    }
    return 0;
}
