/*
 * fiber_x86_64.S - the context switch for x86-64 (System V ABI).
 *
 * A saved context is a 64-byte frame on the fiber's own stack; the fiber
 * keeps only its address. From the saved sp upwards:
 *
 *     +0   MXCSR (4 bytes), x87 control word (2), padding (2)
 *     +8   r15   +16  r14   +24  r13   +32  r12   +40  rbx   +48  rbp
 *     +56  return address
 *
 * Invariants:
 *  - Exactly the callee-saved state of the ABI is kept: rbx, rbp, r12-r15,
 *    the MXCSR and the x87 control word. Everything else is caller-saved,
 *    so the C caller of weft__fiber_swap has already given it up.
 *  - A frame made by weft__fiber_make has the same layout, with the return
 *    address pointing at the start trampoline, entry in rbx and arg in r12;
 *    returning from it leaves rsp 16-byte aligned, as a call requires.
 *  - No system call and no memory other than the two stacks is touched.
 *    MXCSR and the x87 control word are loaded only when they differ from
 *    the current ones: a compare is cheaper than ldmxcsr + fldcw.
 *
 * Every global entry starts with endbr64 (IBT). The symbols are hidden:
 * only fiber.c calls them.
 *
 * Why `ret` and not `pop; jmp *reg`: the return at the end of a switch
 * lands in another context than the return stack buffer predicts, and
 * that misprediction is most of a switch's cost. An indirect jump avoids
 * it while both sides switch from flat loops, but it leaves the return
 * stack buffer unbalanced and was erratic once one side switched from
 * nested calls, as a task awaiting inside a helper does. Measured per
 * resume + suspend on a virtualized Xeon (the H200 host), ret against
 * jmp: flat/flat 32-40 ns against 9-125 ns, flat/nested 38-46 against
 * 108-125, nested/nested 76-90 against 59-71. A jump would also need a
 * `notrack` prefix under IBT, as the C code it lands in has no endbr64.
 */
#if defined(__x86_64__)

	.text

/* void *weft__fiber_make(void *top, void (*entry)(void *), void *arg)
 * Returns the sp of a new context whose first resumption calls
 * entry(arg, transfer) on the stack below top. */
	.globl	weft__fiber_make
	.hidden	weft__fiber_make
	.type	weft__fiber_make, @function
	.p2align 4
weft__fiber_make:
	.cfi_startproc
	endbr64
	movq	%rdi, %rax
	andq	$-16, %rax
	subq	$64, %rax
	/* A new fiber starts with its creator's floating-point control
	 * state, as a new thread does. */
	stmxcsr	0(%rax)
	fnstcw	4(%rax)
	movw	$0, 6(%rax)
	movq	$0, 8(%rax)		/* r15 */
	movq	$0, 16(%rax)		/* r14 */
	movq	$0, 24(%rax)		/* r13 */
	movq	%rdx, 32(%rax)		/* r12: arg */
	movq	%rsi, 40(%rax)		/* rbx: entry */
	movq	$0, 48(%rax)		/* rbp: ends frame-pointer walks */
	leaq	fiber_trampoline(%rip), %rcx
	movq	%rcx, 56(%rax)
	ret
	.cfi_endproc
	.size	weft__fiber_make, .-weft__fiber_make

/* void *weft__fiber_swap(void **save_sp, void *to_sp, void *transfer) */
	.globl	weft__fiber_swap
	.hidden	weft__fiber_swap
	.type	weft__fiber_swap, @function
	.p2align 4
weft__fiber_swap:
	.cfi_startproc
	endbr64
	pushq	%rbp
	.cfi_adjust_cfa_offset 8
	.cfi_rel_offset %rbp, 0
	pushq	%rbx
	.cfi_adjust_cfa_offset 8
	.cfi_rel_offset %rbx, 0
	pushq	%r12
	.cfi_adjust_cfa_offset 8
	.cfi_rel_offset %r12, 0
	pushq	%r13
	.cfi_adjust_cfa_offset 8
	.cfi_rel_offset %r13, 0
	pushq	%r14
	.cfi_adjust_cfa_offset 8
	.cfi_rel_offset %r14, 0
	pushq	%r15
	.cfi_adjust_cfa_offset 8
	.cfi_rel_offset %r15, 0
	subq	$8, %rsp
	.cfi_adjust_cfa_offset 8
	stmxcsr	(%rsp)
	fnstcw	4(%rsp)
	movl	(%rsp), %r8d
	movzwl	4(%rsp), %r9d
	movq	%rsp, (%rdi)
	/* From here on we run on the other context's frame, which has the
	 * same layout, so the unwind info above still describes it. */
	movq	%rsi, %rsp
	/* Loading MXCSR and the x87 control word costs more than comparing
	 * them, and they almost never differ between fibers. */
	cmpl	(%rsp), %r8d
	jne	.Lload_mxcsr
.Lcheck_fpcw:
	cmpw	4(%rsp), %r9w
	jne	.Lload_fpcw
.Lpop:
	.cfi_remember_state
	addq	$8, %rsp
	.cfi_adjust_cfa_offset -8
	popq	%r15
	.cfi_adjust_cfa_offset -8
	.cfi_restore %r15
	popq	%r14
	.cfi_adjust_cfa_offset -8
	.cfi_restore %r14
	popq	%r13
	.cfi_adjust_cfa_offset -8
	.cfi_restore %r13
	popq	%r12
	.cfi_adjust_cfa_offset -8
	.cfi_restore %r12
	popq	%rbx
	.cfi_adjust_cfa_offset -8
	.cfi_restore %rbx
	popq	%rbp
	.cfi_adjust_cfa_offset -8
	.cfi_restore %rbp
	movq	%rdx, %rax
	ret
	.cfi_restore_state
.Lload_mxcsr:
	ldmxcsr	(%rsp)
	jmp	.Lcheck_fpcw
.Lload_fpcw:
	fldcw	4(%rsp)
	jmp	.Lpop
	.cfi_endproc
	.size	weft__fiber_swap, .-weft__fiber_swap

/* _Noreturn void weft__fiber_jump(void *to_sp, void *transfer) */
	.globl	weft__fiber_jump
	.hidden	weft__fiber_jump
	.type	weft__fiber_jump, @function
	.p2align 4
weft__fiber_jump:
	.cfi_startproc
	endbr64
	movq	%rdi, %rsp
	/* Now on the saved frame: describe it as swap does, or an unwinder
	 * stopping here (a profiler's signal) reads the MXCSR word as the
	 * return address. */
	.cfi_def_cfa_offset 64
	.cfi_offset %rbp, -16
	.cfi_offset %rbx, -24
	.cfi_offset %r12, -32
	.cfi_offset %r13, -40
	.cfi_offset %r14, -48
	.cfi_offset %r15, -56
	movq	%rsi, %rdx
	ldmxcsr	(%rsp)
	fldcw	4(%rsp)
	jmp	.Lpop
	.cfi_endproc
	.size	weft__fiber_jump, .-weft__fiber_jump

/* First code of every fiber, reached by the `ret` of its first swap with
 * rax = transfer. Calls entry(arg, transfer); entry must never return, so
 * returning traps. The undefined return address ends backtraces here. */
	.type	fiber_trampoline, @function
	.p2align 4
fiber_trampoline:
	.cfi_startproc
	.cfi_undefined %rip
	endbr64
	movq	%r12, %rdi
	movq	%rax, %rsi
	callq	*%rbx
	ud2
	.cfi_endproc
	.size	fiber_trampoline, .-fiber_trampoline

#endif /* __x86_64__ */

#include "fiber_asm.h"
