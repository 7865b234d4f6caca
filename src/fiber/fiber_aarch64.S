/*
 * fiber_aarch64.S - the context switch for aarch64 (AAPCS64).
 *
 * A saved context is a 176-byte frame on the fiber's own stack; the fiber
 * keeps only its address (sp). From sp upwards:
 *
 *     +0   x19 x20   +16  x21 x22   +32  x23 x24   +48  x25 x26
 *     +64  x27 x28   +80  x29 x30 (fp, lr: where the switch returns)
 *     +96  d8 d9     +112 d10 d11   +128 d12 d13   +144 d14 d15
 *     +160 FPCR      +168 padding
 *
 * Invariants:
 *  - Exactly the callee-saved state of the ABI is kept: x19-x29, x30, sp,
 *    the low halves d8-d15 of v8-v15, and FPCR. Everything else is
 *    caller-saved, so the C caller of weft__fiber_swap has already given
 *    it up. x18 (the platform register) is left alone.
 *  - A frame made by weft__fiber_make has the same layout, with x30 at the
 *    start trampoline, entry in x19 and arg in x20; sp stays 16-byte
 *    aligned throughout, as the architecture requires.
 *  - No system call and no memory other than the two stacks is touched.
 *    FPCR is written only when it differs: a write can stall the pipeline.
 *
 * Every global entry starts with `bti c`. The switch returns with a plain
 * `ret` through x30 and signs nothing, so the object is marked BTI, not PAC.
 * The symbols are hidden: only fiber.c calls them.
 */
#if defined(__aarch64__)

	.text

/* Where a saved frame keeps each register, from the CFA (sp + 176). */
	.macro	saved_frame_cfi
	.cfi_offset x19, -176
	.cfi_offset x20, -168
	.cfi_offset x21, -160
	.cfi_offset x22, -152
	.cfi_offset x23, -144
	.cfi_offset x24, -136
	.cfi_offset x25, -128
	.cfi_offset x26, -120
	.cfi_offset x27, -112
	.cfi_offset x28, -104
	.cfi_offset x29, -96
	.cfi_offset x30, -88
	.cfi_offset d8, -80
	.cfi_offset d9, -72
	.cfi_offset d10, -64
	.cfi_offset d11, -56
	.cfi_offset d12, -48
	.cfi_offset d13, -40
	.cfi_offset d14, -32
	.cfi_offset d15, -24
	.endm

/* void *weft__fiber_make(void *top, void (*entry)(void *), void *arg)
 * Returns the sp of a new context whose first resumption calls
 * entry(arg, transfer) on the stack below top. */
	.globl	weft__fiber_make
	.hidden	weft__fiber_make
	.type	weft__fiber_make, %function
	.p2align 4
weft__fiber_make:
	.cfi_startproc
	bti	c
	and	x9, x0, #-16
	sub	x0, x9, #176
	stp	x1, x2, [x0, #0]	/* x19: entry, x20: arg */
	stp	xzr, xzr, [x0, #16]
	stp	xzr, xzr, [x0, #32]
	stp	xzr, xzr, [x0, #48]
	stp	xzr, xzr, [x0, #64]
	adr	x10, fiber_trampoline
	stp	xzr, x10, [x0, #80]	/* x29 = 0 ends frame-pointer walks */
	stp	xzr, xzr, [x0, #96]
	stp	xzr, xzr, [x0, #112]
	stp	xzr, xzr, [x0, #128]
	stp	xzr, xzr, [x0, #144]
	/* A new fiber starts with its creator's floating-point control
	 * state, as a new thread does. */
	mrs	x10, fpcr
	stp	x10, xzr, [x0, #160]
	ret
	.cfi_endproc
	.size	weft__fiber_make, .-weft__fiber_make

/* void *weft__fiber_swap(void **save_sp, void *to_sp, void *transfer) */
	.globl	weft__fiber_swap
	.hidden	weft__fiber_swap
	.type	weft__fiber_swap, %function
	.p2align 4
weft__fiber_swap:
	.cfi_startproc
	bti	c
	sub	sp, sp, #176
	.cfi_def_cfa_offset 176
	stp	x19, x20, [sp, #0]
	stp	x21, x22, [sp, #16]
	stp	x23, x24, [sp, #32]
	stp	x25, x26, [sp, #48]
	stp	x27, x28, [sp, #64]
	stp	x29, x30, [sp, #80]
	stp	d8, d9, [sp, #96]
	stp	d10, d11, [sp, #112]
	stp	d12, d13, [sp, #128]
	stp	d14, d15, [sp, #144]
	saved_frame_cfi
	mrs	x9, fpcr
	str	x9, [sp, #160]
	mov	x9, sp
	str	x9, [x0]
	/* From here on we run on the other context's frame, which has the
	 * same layout, so the unwind info above still describes it. */
	mov	sp, x1
.Lrestore:
	ldr	x9, [sp, #160]
	mrs	x10, fpcr
	cmp	x9, x10
	b.eq	1f
	msr	fpcr, x9
1:
	ldp	x19, x20, [sp, #0]
	ldp	x21, x22, [sp, #16]
	ldp	x23, x24, [sp, #32]
	ldp	x25, x26, [sp, #48]
	ldp	x27, x28, [sp, #64]
	ldp	x29, x30, [sp, #80]
	ldp	d8, d9, [sp, #96]
	ldp	d10, d11, [sp, #112]
	ldp	d12, d13, [sp, #128]
	ldp	d14, d15, [sp, #144]
	add	sp, sp, #176
	.cfi_def_cfa_offset 0
	.cfi_restore x19
	.cfi_restore x20
	.cfi_restore x21
	.cfi_restore x22
	.cfi_restore x23
	.cfi_restore x24
	.cfi_restore x25
	.cfi_restore x26
	.cfi_restore x27
	.cfi_restore x28
	.cfi_restore x29
	.cfi_restore x30
	.cfi_restore d8
	.cfi_restore d9
	.cfi_restore d10
	.cfi_restore d11
	.cfi_restore d12
	.cfi_restore d13
	.cfi_restore d14
	.cfi_restore d15
	mov	x0, x2
	ret
	.cfi_endproc
	.size	weft__fiber_swap, .-weft__fiber_swap

/* _Noreturn void weft__fiber_jump(void *to_sp, void *transfer) */
	.globl	weft__fiber_jump
	.hidden	weft__fiber_jump
	.type	weft__fiber_jump, %function
	.p2align 4
weft__fiber_jump:
	.cfi_startproc
	bti	c
	mov	sp, x0
	/* Now on the saved frame: describe it as swap does, or an unwinder
	 * stopping here (a profiler's signal) walks from the wrong frame. */
	.cfi_def_cfa_offset 176
	saved_frame_cfi
	mov	x2, x1
	b	.Lrestore
	.cfi_endproc
	.size	weft__fiber_jump, .-weft__fiber_jump

/* First code of every fiber, reached by the `ret` of its first swap with
 * x0 = transfer. Calls entry(arg, transfer); entry must never return, so
 * returning traps. The undefined return address ends backtraces here. */
	.type	fiber_trampoline, %function
	.p2align 4
fiber_trampoline:
	.cfi_startproc
	.cfi_undefined x30
	bti	c
	mov	x1, x0
	mov	x0, x20
	blr	x19
	brk	#0
	.cfi_endproc
	.size	fiber_trampoline, .-fiber_trampoline

#endif /* __aarch64__ */

#include "fiber_asm.h"
