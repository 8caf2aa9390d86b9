/*
 * SPDX-License-Identifier: GPL-2.0-or-later
 *
 * icount: a QEMU TCG plugin (plugin API version 1, QEMU 7.2) that counts every guest instruction
 * the emulated process executes, exactly (not sampled), and writes the total at exit:
 *
 *   qemu-aarch64 -plugin icount.so,out=FILE ./program     (without out=, to stderr)
 *
 * A benchmark tool of tern-bench (`tern-bench icount`), loaded into QEMU; it is never part of the
 * tern binary. Licensed GPL-2.0-or-later, as QEMU's own plugin API and examples are.
 *
 * Counting: at translation each block gets an execution callback carrying its instruction count.
 * QEMU 7.2's inline add is a plain (non-atomic) add to one shared word, and in user mode every
 * guest thread runs on a host thread of its own, so inline counting would lose updates in a
 * multi-threaded broker. The callback instead adds to the slot of its vCPU: a vCPU index belongs
 * to one live thread at a time, so the slots need no atomics; indexes past the table share one
 * atomic counter.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qemu-plugin-api.h"

QEMU_PLUGIN_EXPORT int qemu_plugin_version = QEMU_PLUGIN_VERSION;

#define SLOTS 1024

/* One cache line per vCPU, so threads on different host cores do not share a line. */
struct slot {
    uint64_t insns;
    char pad[56];
};

static struct slot slots[SLOTS];
static uint64_t overflow_insns;
static const char *out_path;

static void block_executed(unsigned int vcpu_index, void *userdata)
{
    uint64_t insns = (uint64_t)(uintptr_t)userdata;
    if (vcpu_index < SLOTS) {
        slots[vcpu_index].insns += insns;
    } else {
        __atomic_fetch_add(&overflow_insns, insns, __ATOMIC_RELAXED);
    }
}

static void block_translated(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    (void)id;
    size_t insns = qemu_plugin_tb_n_insns(tb);
    qemu_plugin_register_vcpu_tb_exec_cb(tb, block_executed, QEMU_PLUGIN_CB_NO_REGS,
                                         (void *)(uintptr_t)insns);
}

static uint64_t total_insns(void)
{
    uint64_t total = __atomic_load_n(&overflow_insns, __ATOMIC_RELAXED);
    for (size_t i = 0; i < SLOTS; i++) {
        total += slots[i].insns;
    }
    return total;
}

static void at_exit(qemu_plugin_id_t id, void *userdata)
{
    (void)id;
    (void)userdata;
    char line[64];
    snprintf(line, sizeof line, "insns %llu\n", (unsigned long long)total_insns());
    FILE *out = out_path ? fopen(out_path, "w") : NULL;
    if (out) {
        fputs(line, out);
        fclose(out);
    } else {
        fputs(line, stderr);
    }
}

QEMU_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc,
                                           char **argv)
{
    (void)info;
    for (int i = 0; i < argc; i++) {
        if (strncmp(argv[i], "out=", 4) == 0) {
            out_path = strdup(argv[i] + 4);
        } else {
            fprintf(stderr, "icount: unknown argument '%s' (only out=FILE)\n", argv[i]);
            return -1;
        }
    }
    qemu_plugin_register_vcpu_tb_trans_cb(id, block_translated);
    qemu_plugin_register_atexit_cb(id, at_exit, NULL);
    return 0;
}
