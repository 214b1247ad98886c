/* Just enough of the kernel's headers to compile its generic C ciphers
 * (crypto/serpent_generic.c, crypto/twofish_*.c) as userspace code, unchanged, for
 * scripts/bench-kernel-generic.sh. Little-endian x86 only. */
#ifndef KSTUB_H
#define KSTUB_H
#include <errno.h>
#include <stdint.h>
#include <string.h>
typedef uint8_t u8;
typedef uint16_t u16;
typedef uint32_t u32;
typedef uint64_t u64;
typedef uint32_t __le32;
/* glibc's <errno.h> reaches <linux/errno.h>, which is this stub: the one value used. */
#ifndef EINVAL
#define EINVAL 22
#endif
static inline u32 rol32(u32 w, unsigned int s) { return (w << (s & 31)) | (w >> ((-s) & 31)); }
static inline u32 ror32(u32 w, unsigned int s) { return (w >> (s & 31)) | (w << ((-s) & 31)); }
static inline u32 get_unaligned_le32(const void *p) { u32 v; memcpy(&v, p, 4); return v; }
static inline void put_unaligned_le32(u32 v, void *p) { memcpy(p, &v, 4); }
#define le32_to_cpu(x) (x)
#define cpu_to_le32(x) (x)
#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)
#define noinline __attribute__((noinline))
#define __init
#define __exit
#define EXPORT_SYMBOL_GPL(x)
#define MODULE_LICENSE(x)
#define MODULE_DESCRIPTION(x)
#define MODULE_AUTHOR(x)
#define MODULE_ALIAS_CRYPTO(x)
#define module_init(x)
#define module_exit(x)
#define subsys_initcall(x)
#define THIS_MODULE 0
#define CRYPTO_ALG_TYPE_CIPHER 1
struct crypto_tfm { int unused; };
/* The context is the "tfm" itself here. */
#define crypto_tfm_ctx(t) ((void *)(t))
struct cipher_alg {
	unsigned int cia_min_keysize, cia_max_keysize;
	int (*cia_setkey)(struct crypto_tfm *, const u8 *, unsigned int);
	void (*cia_encrypt)(struct crypto_tfm *, u8 *, const u8 *);
	void (*cia_decrypt)(struct crypto_tfm *, u8 *, const u8 *);
};
struct crypto_alg {
	const char *cra_name, *cra_driver_name;
	int cra_priority;
	u32 cra_flags;
	unsigned int cra_blocksize, cra_ctxsize, cra_alignmask;
	void *cra_module;
	union { struct cipher_alg cipher; } cra_u;
};
static inline int crypto_register_alg(struct crypto_alg *a) { (void)a; return 0; }
static inline void crypto_unregister_alg(struct crypto_alg *a) { (void)a; }
#endif
