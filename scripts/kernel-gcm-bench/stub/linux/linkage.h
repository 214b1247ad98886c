/* The few assembler macros of the kernel's <linux/linkage.h> that its x86 AES-GCM and
 * AES-NI assembly uses, so that the files assemble unchanged into a userspace program. */
#define SYM_FUNC_START(n)       .globl n; .type n, @function; .p2align 4; n:
#define SYM_TYPED_FUNC_START(n) SYM_FUNC_START(n)
#define SYM_FUNC_START_LOCAL(n) .type n, @function; .p2align 4; n:
#define SYM_FUNC_END(n)         .size n, . - n
#define SYM_FUNC_ALIAS_LOCAL(a, n) .set a, n
#define RET ret
