/* The kernel's generic C Serpent and Twofish (Debian's linux-source, compiled unchanged
 * against stub/ headers) in XTS as the kernel's crypto/xts.c runs them over one dm-crypt
 * sector: T = E_k2(IV); per 16-byte block x ^= T, E_k1(x), x ^= T, T *= alpha (GF(2^128),
 * little-endian). `bench SECONDS CIPHER [SECTOR]` prints "ENCRYPT DECRYPT" in MB/s
 * (10^6 B/s, one core, default 4096-byte sectors); `bench 0 check` prints each cipher's
 * first 16 bytes of sector 0 of zeros, so the build can be checked against cryptblk. */
#include "serpent_generic.c"
#include "twofish_common.c"
#include "twofish_generic.c"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef void (*blockfn)(void *ctx, u8 *dst, const u8 *src);
static void srp_enc(void *c, u8 *d, const u8 *s) { __serpent_encrypt(c, d, s); }
static void srp_dec(void *c, u8 *d, const u8 *s) { __serpent_decrypt(c, d, s); }
static void tf_enc(void *c, u8 *d, const u8 *s) { twofish_encrypt((struct crypto_tfm *)c, d, s); }
static void tf_dec(void *c, u8 *d, const u8 *s) { twofish_decrypt((struct crypto_tfm *)c, d, s); }

static void mul_alpha(u8 t[16]) {
	u64 lo, hi;
	memcpy(&lo, t, 8); memcpy(&hi, t + 8, 8);
	u64 carry = hi >> 63;
	hi = (hi << 1) | (lo >> 63);
	lo = (lo << 1) ^ (carry * 0x87);
	memcpy(t, &lo, 8); memcpy(t + 8, &hi, 8);
}

static void xts(blockfn data, void *k1, blockfn tweak, void *k2, u64 sector, u8 *buf, size_t len) {
	u8 t[16] = {0}, x[16];
	memcpy(t, &sector, 8);
	tweak(k2, t, t);
	for (size_t i = 0; i < len; i += 16) {
		for (int j = 0; j < 16; j++) x[j] = buf[i + j] ^ t[j];
		data(k1, x, x);
		for (int j = 0; j < 16; j++) buf[i + j] = x[j] ^ t[j];
		mul_alpha(t);
	}
}

static double now(void) { struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); return ts.tv_sec + ts.tv_nsec / 1e9; }

int main(int argc, char **argv) {
	if (argc < 3) {
		fprintf(stderr, "usage: bench SECONDS serpent|twofish|check [SECTOR]\n");
		return 2;
	}
	double secs = atof(argv[1]);
	size_t ss = argc > 3 ? (size_t)atoi(argv[3]) : 4096;
	static struct serpent_ctx s1, s2;
	static struct twofish_ctx t1, t2;
	u8 key[64];
	for (int i = 0; i < 64; i++) key[i] = (u8)i;
	__serpent_setkey(&s1, key, 32); __serpent_setkey(&s2, key + 32, 32);
	__twofish_setkey(&t1, key, 32); __twofish_setkey(&t2, key + 32, 32);
	struct { const char *name; void *k1, *k2; blockfn enc, dec; } c[] = {
		{ "serpent", &s1, &s2, srp_enc, srp_dec }, { "twofish", &t1, &t2, tf_enc, tf_dec } };
	static u8 buf[4096];
	if (ss < 16 || ss > sizeof buf || ss % 16) return 2;
	for (int i = 0; i < 2; i++) {
		if (!strcmp(argv[2], "check")) {
			/* Sector 0 of zeros under the key 00 01 .. 3f: its first 16 bytes. */
			memset(buf, 0, sizeof buf);
			xts(c[i].enc, c[i].k1, c[i].enc, c[i].k2, 0, buf, 512);
			printf("%s ", c[i].name);
			for (int j = 0; j < 16; j++) printf("%02x", buf[j]);
			printf("\n");
			continue;
		}
		if (strcmp(argv[2], c[i].name)) continue;
		for (int dir = 0; dir < 2; dir++) {
			blockfn f = dir ? c[i].dec : c[i].enc;
			u64 n = 0; double t0 = now(), t;
			do { for (int r = 0; r < 64; r++) xts(f, c[i].k1, c[i].enc, c[i].k2, n++, buf, ss); } while ((t = now() - t0) < secs);
			printf(dir ? "%.0f\n" : "%.0f ", n * ss / t / 1e6);
		}
	}
	return 0;
}
