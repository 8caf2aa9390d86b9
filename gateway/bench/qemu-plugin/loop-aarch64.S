// SPDX-License-Identifier: GPL-2.0-or-later
// The icount plugin's known loop: ITERATIONS passes of 3 instructions, then exit(0).
// Executes exactly 1 + 3 * ITERATIONS + 3 instructions.
    .global _start
    .text
_start:
    ldr x0, =ITERATIONS
1:  add x1, x1, #1
    subs x0, x0, #1
    b.ne 1b
    mov x0, #0
    mov x8, #93         // exit
    svc #0
