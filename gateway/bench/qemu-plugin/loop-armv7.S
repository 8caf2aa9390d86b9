@ SPDX-License-Identifier: GPL-2.0-or-later
@ The icount plugin's known loop: ITERATIONS passes of 3 instructions, then exit(0).
@ Executes exactly 1 + 3 * ITERATIONS + 3 instructions.
    .syntax unified
    .arm
    .global _start
    .text
_start:
    ldr r0, =ITERATIONS
1:  add r1, r1, #1
    subs r0, r0, #1
    bne 1b
    mov r0, #0
    mov r7, #1          @ exit
    svc #0
