/*
 * SPDX-License-Identifier: GPL-2.0-or-later
 *
 * icount: a QEMU TCG plugin (plugin API version 1, QEMU 7.2) that counts every guest instruction
 * the emulated process executes, exactly (not sampled), and writes the total at exit:
 *
 *   qemu-aarch64 -plugin icount.so,out=FILE ./program     (without out=, to stderr)
 *   qemu-aarch64 -plugin icount.so,out=FILE,blocks=BLOCKS ./program
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
 *
 * Attribution (blocks=BLOCKS): every translated block also gets a record of its instructions'
 * guest addresses and an atomic execution count. At exit the plugin writes one line per block
 * that ran, `FILE COUNT OFFSET...`: the file the block's code was mapped from (QEMU user mode
 * maps the guest's files into its own address space, so the block's host address is found in
 * QEMU's /proc/self/maps), how often it ran, and the file offset of each of its instructions in
 * hexadecimal. Symbols are looked up by tern-bench, not here. A block translated twice has two
 * lines.
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
static const char *blocks_path;

/* A translated block, for attribution: its execution count and its instructions' addresses. */
struct block {
    struct block *next;
    uint64_t execs;
    const void *haddr;
    size_t n_insns;
    uint64_t vaddr[];
};

static struct block *blocks;

static void block_executed(unsigned int vcpu_index, void *userdata)
{
    uint64_t insns = (uint64_t)(uintptr_t)userdata;
    if (vcpu_index < SLOTS) {
        slots[vcpu_index].insns += insns;
    } else {
        __atomic_fetch_add(&overflow_insns, insns, __ATOMIC_RELAXED);
    }
}

/* The attributing variant of block_executed: the total as above, and the block's own count. */
static void block_executed_recorded(unsigned int vcpu_index, void *userdata)
{
    struct block *block = userdata;
    block_executed(vcpu_index, (void *)(uintptr_t)block->n_insns);
    __atomic_fetch_add(&block->execs, 1, __ATOMIC_RELAXED);
}

static void block_translated(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    (void)id;
    size_t insns = qemu_plugin_tb_n_insns(tb);
    if (!blocks_path || insns == 0) {
        qemu_plugin_register_vcpu_tb_exec_cb(tb, block_executed, QEMU_PLUGIN_CB_NO_REGS,
                                             (void *)(uintptr_t)insns);
        return;
    }
    struct block *block = calloc(1, sizeof *block + insns * sizeof block->vaddr[0]);
    if (!block) {
        abort();
    }
    block->n_insns = insns;
    block->haddr = qemu_plugin_insn_haddr(qemu_plugin_tb_get_insn(tb, 0));
    for (size_t i = 0; i < insns; i++) {
        block->vaddr[i] = qemu_plugin_insn_vaddr(qemu_plugin_tb_get_insn(tb, i));
    }
    block->next = __atomic_load_n(&blocks, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(&blocks, &block->next, block, 1, __ATOMIC_RELEASE,
                                        __ATOMIC_RELAXED)) {
    }
    qemu_plugin_register_vcpu_tb_exec_cb(tb, block_executed_recorded, QEMU_PLUGIN_CB_NO_REGS,
                                         block);
}

static uint64_t total_insns(void)
{
    uint64_t total = __atomic_load_n(&overflow_insns, __ATOMIC_RELAXED);
    for (size_t i = 0; i < SLOTS; i++) {
        total += slots[i].insns;
    }
    return total;
}

/* One file-backed mapping of QEMU's own address space. */
struct mapping {
    uintptr_t start, end;
    uint64_t offset;
    char path[256];
};

/* The file-backed mappings of /proc/self/maps; *count is set to how many. */
static struct mapping *read_mappings(size_t *count)
{
    *count = 0;
    FILE *maps = fopen("/proc/self/maps", "r");
    if (!maps) {
        return NULL;
    }
    size_t capacity = 256;
    struct mapping *all = malloc(capacity * sizeof *all);
    char line[512];
    while (all && fgets(line, sizeof line, maps)) {
        struct mapping m;
        unsigned long start, end;
        unsigned long long offset;
        m.path[0] = 0;
        if (sscanf(line, "%lx-%lx %*s %llx %*s %*s %255s", &start, &end, &offset, m.path) < 4 ||
            m.path[0] != '/') {
            continue;
        }
        m.start = start;
        m.end = end;
        m.offset = offset;
        if (*count == capacity) {
            capacity *= 2;
            struct mapping *grown = realloc(all, capacity * sizeof *all);
            if (!grown) {
                break;
            }
            all = grown;
        }
        all[(*count)++] = m;
    }
    fclose(maps);
    return all;
}

/* Writes a line per block that ran: its file, execution count and instruction offsets. */
static void write_blocks(void)
{
    FILE *out = fopen(blocks_path, "w");
    if (!out) {
        fprintf(stderr, "icount: cannot write %s\n", blocks_path);
        return;
    }
    size_t n_maps;
    struct mapping *maps = read_mappings(&n_maps);
    for (struct block *b = __atomic_load_n(&blocks, __ATOMIC_ACQUIRE); b; b = b->next) {
        uint64_t execs = __atomic_load_n(&b->execs, __ATOMIC_RELAXED);
        if (execs == 0) {
            continue;
        }
        const struct mapping *m = NULL;
        for (size_t i = 0; maps && i < n_maps; i++) {
            if ((uintptr_t)b->haddr >= maps[i].start && (uintptr_t)b->haddr < maps[i].end) {
                m = &maps[i];
                break;
            }
        }
        if (!m) {
            fprintf(out, "? %llu", (unsigned long long)execs);
            for (size_t i = 0; i < b->n_insns; i++) {
                fprintf(out, " %llx", (unsigned long long)b->vaddr[i]);
            }
            fputc('\n', out);
            continue;
        }
        uint64_t first = m->offset + ((uintptr_t)b->haddr - m->start);
        fprintf(out, "%s %llu", m->path, (unsigned long long)execs);
        for (size_t i = 0; i < b->n_insns; i++) {
            fprintf(out, " %llx", (unsigned long long)(first + (b->vaddr[i] - b->vaddr[0])));
        }
        fputc('\n', out);
    }
    free(maps);
    fclose(out);
}

static void at_exit(qemu_plugin_id_t id, void *userdata)
{
    (void)id;
    (void)userdata;
    if (blocks_path) {
        write_blocks();
    }
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
        } else if (strncmp(argv[i], "blocks=", 7) == 0) {
            blocks_path = strdup(argv[i] + 7);
        } else {
            fprintf(stderr, "icount: unknown argument '%s' (out=FILE, blocks=FILE)\n", argv[i]);
            return -1;
        }
    }
    qemu_plugin_register_vcpu_tb_trans_cb(id, block_translated);
    qemu_plugin_register_atexit_cb(id, at_exit, NULL);
    return 0;
}
