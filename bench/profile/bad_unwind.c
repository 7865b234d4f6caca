/*
 * bad_unwind: spins in a function whose unwind table is wrong, so that an
 * unwinder interrupting it reads far beyond the stack. The sampler's test
 * runs it: the sampler must come back from the fault and keep the sample.
 *
 *   bad_unwind [MILLISECONDS]   (default 400 of CPU time)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* void spin_with_bad_cfi(uint64_t n): n turns of a loop. Its table puts the
 * caller's frame 1 GiB above the stack pointer. */
void spin_with_bad_cfi(uint64_t n);

#if defined(__x86_64__)
__asm__(".text\n"
        ".globl spin_with_bad_cfi\n"
        ".type spin_with_bad_cfi, @function\n"
        "spin_with_bad_cfi:\n"
        ".cfi_startproc\n"
        ".cfi_def_cfa %rsp, 0x40000000\n"
        "1: sub $1, %rdi\n"
        "   jnz 1b\n"
        "   ret\n"
        ".cfi_endproc\n"
        ".size spin_with_bad_cfi, .-spin_with_bad_cfi\n");
#elif defined(__aarch64__)
__asm__(".text\n"
        ".globl spin_with_bad_cfi\n"
        ".type spin_with_bad_cfi, %function\n"
        "spin_with_bad_cfi:\n"
        ".cfi_startproc\n"
        ".cfi_def_cfa sp, 0x40000000\n"
        "1: subs x0, x0, #1\n"
        "   b.ne 1b\n"
        "   ret\n"
        ".cfi_endproc\n"
        ".size spin_with_bad_cfi, .-spin_with_bad_cfi\n");
#else
#error "bad_unwind: unsupported architecture"
#endif

static double cpu_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int main(int argc, char **argv)
{
    double ms = argc > 1 ? atof(argv[1]) : 400, start = cpu_ms();
    while (cpu_ms() - start < ms)
        spin_with_bad_cfi(1u << 20);
    printf("spun %.0f ms\n", cpu_ms() - start);
    return 0;
}
