/*
 * fiber_asm.h - ELF notes for the fiber layer's assembly files.
 *
 * Included at the end of fiber_x86_64.S and fiber_aarch64.S, outside their
 * ISA guards, so that each object carries the notes of the ISA it is built
 * for even when its code is compiled out. This matters: the linker ANDs the
 * GNU property notes of all inputs, and an object without one - such as
 * fiber_aarch64.o built on x86-64, which is otherwise empty - would strip
 * the IBT/BTI marking from the whole library.
 *
 * The notes say:
 *  - .note.GNU-stack: the code needs no executable stack.
 *  - x86-64: IBT only (every entry point starts with endbr64). NOT SHSTK:
 *    a switch loads another stack and returns with a plain `ret` to an
 *    address that the shadow stack has never seen, so running under a
 *    shadow stack would need shadow-stack switching (rstorssp/saveprevssp)
 *    that this code does not do.
 *  - aarch64: BTI (every entry point starts with `bti c`). Not PAC: the
 *    switch does not sign the return addresses it saves.
 */
#ifndef WEFT_FIBER_ASM_H
#define WEFT_FIBER_ASM_H

/* clang-format off */
#if defined(__x86_64__) || defined(__aarch64__)
#if defined(__x86_64__)
#define WEFT__GNU_PROPERTY_FEATURE_1_AND 0xc0000002 /* GNU_PROPERTY_X86_FEATURE_1_AND */
#define WEFT__GNU_PROPERTY_FEATURE_1_BITS 0x1       /* IBT */
#else
#define WEFT__GNU_PROPERTY_FEATURE_1_AND 0xc0000000 /* GNU_PROPERTY_AARCH64_FEATURE_1_AND */
#define WEFT__GNU_PROPERTY_FEATURE_1_BITS 0x1       /* BTI */
#endif
	.pushsection .note.gnu.property, "a"
	.p2align 3
	.long	4				/* n_namesz: "GNU\0" */
	.long	16				/* n_descsz */
	.long	5				/* n_type: NT_GNU_PROPERTY_TYPE_0 */
	.asciz	"GNU"
	.long	WEFT__GNU_PROPERTY_FEATURE_1_AND	/* pr_type */
	.long	4				/* pr_datasz */
	.long	WEFT__GNU_PROPERTY_FEATURE_1_BITS	/* pr_data */
	.long	0				/* pad to 8 bytes */
	.popsection
#endif

	.pushsection .note.GNU-stack, "", %progbits
	.popsection
/* clang-format on */

#endif
