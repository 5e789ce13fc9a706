/* Go's thread limit, from what the runtime says as it dies: "runtime: program exceeds N-thread
 * limit" is printed when a program starts more OS threads than debug.SetMaxThreads allows (10000
 * by default), just before it exits with status 2. The limit itself lives in the runtime's
 * memory, out of fdtrace's sight; this message is the one place it shows.
 *
 * The runtime's print() writes each piece through runtime.gwrite(b []byte): the prefix, then
 * the digits of N, then the rest. A uprobe on gwrite (attached to each Go binary seen, Go 1.18 or
 * later, whose register ABI passes b's pointer and length in the first two argument registers)
 * remembers a thread that wrote the prefix and reads N from its next write. gwrite runs only for
 * the runtime's own prints (crashes, GODEBUG traces), never for a program's own output. */

#if defined(__x86_64__)
#define FDT_GO_ARG0(ctx) ((ctx)->ax)
#define FDT_GO_ARG1(ctx) ((ctx)->bx)
#elif defined(__aarch64__)
#define FDT_GO_ARG0(ctx) ((ctx)->regs[0])
#define FDT_GO_ARG1(ctx) ((ctx)->regs[1])
#endif

#ifdef FDT_GO_ARG0
#define FDT_GO_PREFIX "runtime: program exceeds "
#define FDT_GO_PREFIX_LEN (sizeof(FDT_GO_PREFIX) - 1)
#define FDT_GO_DIGITS 10

/* Threads that have just printed the prefix (a few at most: the program is dying). */
BPF_HASH(go_exceeds_pending, u32, u8, 256);

int fdt_go_gwrite(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, tid = (u32)id;
    u64 len = FDT_GO_ARG1(ctx);
    const void *text = (const void *)FDT_GO_ARG0(ctx);
    if (len == FDT_GO_PREFIX_LEN) {
        char seen[FDT_GO_PREFIX_LEN];
        const char want[] = FDT_GO_PREFIX;
        if (bpf_probe_read_user(seen, sizeof(seen), text))
            return 0;
#pragma unroll
        for (int i = 0; i < FDT_GO_PREFIX_LEN; i++)
            if (seen[i] != want[i])
                return 0;
        u8 one = 1;
        go_exceeds_pending.update(&tid, &one);
        return 0;
    }
    if (!go_exceeds_pending.lookup(&tid))
        return 0;
    go_exceeds_pending.delete(&tid);
    if (len == 0 || len > FDT_GO_DIGITS || fdt_skip(tgid))
        return 0;
    char digits[FDT_GO_DIGITS] = {};
    if (bpf_probe_read_user(digits, sizeof(digits), text))
        return 0;
    s64 limit = 0;
#pragma unroll
    for (int i = 0; i < FDT_GO_DIGITS; i++) {
        if (i >= len)
            break;
        if (digits[i] < '0' || digits[i] > '9')
            return 0;
        limit = limit * 10 + (digits[i] - '0');
    }
    struct fdt_event event = {};
    fdt_fill(&event, FDT_KIND_GO_THREAD_LIMIT, 0, tgid, tid);
    event.ret = limit;
    fdt_emit_ending(&event);
    return 0;
}
#endif
