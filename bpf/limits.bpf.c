/* setrlimit() and prlimit64() of RLIMIT_NOFILE and RLIMIT_NPROC: who changed whose limit, to
 * what, and whether the kernel took it (kind limit_change). The new limit is read from the
 * caller's memory at the entry, the result at the exit; prlimit64 names its target (0: itself).
 * A change is traced when its caller or its target is (--pid). Sent under FDT_ERRORS_ONLY too:
 * they are rare, and without them a failure cannot be judged by the limit in force then. */

#ifdef FDT_LIMITS
#define FDT_RLIMIT_NPROC 6
#define FDT_RLIMIT_NOFILE 7

struct fdt_sys_enter_prlimit64_args {
    u64 common;
    int syscall_nr;
    int pad;
    u64 pid;
    u64 resource;
    u64 new_rlim;
    u64 old_rlim;
};

struct fdt_sys_enter_setrlimit_args {
    u64 common;
    int syscall_nr;
    int pad;
    u64 resource;
    u64 rlim;
};

struct fdt_limit_entry {
    u64 soft;
    u64 hard;
    u32 target;
    u32 resource;
};

/* Changes in flight, by tid: a few at a time on any host. */
BPF_HASH(entry_limit, u32, struct fdt_limit_entry, 1024);

static __always_inline int fdt_limit_enter(u32 target, u64 resource, u64 new_rlim)
{
    if ((resource != FDT_RLIMIT_NOFILE && resource != FDT_RLIMIT_NPROC) || !new_rlim)
        return 0; /* another limit, or a read of one */
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, tid = (u32)id;
    if (!target)
        target = tgid;
    if (fdt_skip(tgid) && fdt_skip(target))
        return 0;
    struct fdt_limit_entry entry = {.target = target, .resource = (u32)resource};
    u64 wanted[2] = {};
    if (bpf_probe_read_user(wanted, sizeof(wanted), (const void *)new_rlim))
        return 0; /* the kernel will refuse it with EFAULT too */
    entry.soft = wanted[0];
    entry.hard = wanted[1];
    entry_limit.update(&tid, &entry);
    return 0;
}

int fdt_enter_prlimit64(struct fdt_sys_enter_prlimit64_args *args)
{
    return fdt_limit_enter((u32)args->pid, args->resource, args->new_rlim);
}

int fdt_enter_setrlimit(struct fdt_sys_enter_setrlimit_args *args)
{
    return fdt_limit_enter(0, args->resource, args->rlim);
}

static __always_inline int fdt_limit_exit(long ret, u8 sc)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, tid = (u32)id;
    struct fdt_limit_entry *found = entry_limit.lookup(&tid);
    if (!found)
        return 0;
    struct fdt_limit_entry entry = *found;
    entry_limit.delete(&tid);
    struct fdt_event *e = fdt_reserve(FDT_KIND_LIMIT_CHANGE, sc, tgid, tid);
    if (!e)
        return 0;
    e->ret = ret;
    if (ret < 0)
        e->errno_ = (u16)(-ret);
    e->extra[FDT_X_LIMIT_CHANGE_TARGET] = entry.target;
    e->extra[FDT_X_LIMIT_CHANGE_RESOURCE] = entry.resource;
    e->extra[FDT_X_LIMIT_CHANGE_SOFT] = entry.soft;
    e->extra[FDT_X_LIMIT_CHANGE_HARD] = entry.hard;
    fdt_submit(e);
    return 0;
}

int fdt_exit_prlimit64(struct fdt_sys_exit_args *args)
{
    return fdt_limit_exit(args->ret, FDT_SC_prlimit64);
}

int fdt_exit_setrlimit(struct fdt_sys_exit_args *args)
{
    return fdt_limit_exit(args->ret, FDT_SC_setrlimit);
}
#endif
