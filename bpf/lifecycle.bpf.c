/* Threads and processes (start, exec, exit with its code or signal) and OOM kills. */

#ifdef FDT_HAVE_task_newtask
/* Fires in the creating task for every clone/fork/vfork/clone3, Go's raw clone() included. */
TRACEPOINT_PROBE(task, task_newtask)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    int is_thread = (args->clone_flags & FDT_CLONE_THREAD) != 0;
    if (is_thread) {
        if (fdt_skip(tgid))
            return 0;
        struct fdt_counters *c = fdt_counters_for(tgid);
        if (c)
            lock_xadd(&c->n[FDT_C_THREADS_STARTED], 1);
#ifdef FDT_ERRORS_ONLY
        return 0;
#endif
        struct fdt_event *e = fdt_reserve(FDT_KIND_THREAD_START, 0, tgid, args->pid);
        if (!e)
            return 0;
        e->extra[FDT_X_THREAD_START_CREATOR_TID] = (u32)id; /* the creating thread */
#ifdef FDT_STACKS
        e->extra[FDT_X_STACK] = fdt_user_stack(args, tgid);
#endif
        fdt_submit(e);
        return 0;
    }
#ifdef FDT_FOLLOW_CHILDREN
    if (pid_filter.lookup(&tgid)) {
        u32 started = args->pid;
        u8 traced = 1;
        if (pid_filter.update(&started, &traced) != 0)
            fdt_stat(FDT_STAT_FOLLOWED_FULL);
    }
#endif
#ifdef FDT_ERRORS_ONLY
    return 0;
#else
    u32 child = args->pid;
    if (fdt_skip(tgid) && fdt_skip(child))
        return 0;
    struct fdt_event *e = fdt_reserve(FDT_KIND_PROCESS_START, 0, child, child);
    if (!e)
        return 0;
    e->extra[FDT_X_PROCESS_START_PPID] = tgid; /* parent process */
    fdt_submit(e);
    return 0;
#endif
}
#endif

#ifdef FDT_HAVE_sched_process_exec
TRACEPOINT_PROBE(sched, sched_process_exec)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (fdt_skip(tgid))
        return 0;
    struct fdt_counters *c = counters.lookup(&tgid);
    if (c)
        bpf_get_current_comm(&c->comm, sizeof(c->comm));
#ifdef FDT_STACKS
    fdt_fd_table_changed(tgid, FDT_FD_EXEC); /* its close-on-exec descriptors are closed */
#endif
    /* Sent under FDT_ERRORS_ONLY too: user space looks at each new program as it starts (a Go
     * binary gets its thread-limit uprobe before it can die of it), then drops these events. */
    struct fdt_event *e = fdt_reserve(FDT_KIND_PROCESS_EXEC, 0, tgid, tgid);
    if (!e)
        return 0;
    e->extra[FDT_X_PROCESS_EXEC_OLD_TID] = args->old_pid;
    fdt_submit(e);
    return 0;
}
#endif

/* Exit code or fatal signal, first one wins: when a thread calls exit_group() the kernel then
 * kills its siblings with SIGKILL, which must not hide the code. */
static __always_inline void fdt_note_exit_status(u32 code, u32 signal)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    struct fdt_exit_status status = {.code = code, .signal = signal};
    exit_status.insert(&tgid, &status);
}

int fdt_enter_exit_group(struct fdt_sys_enter_args *args)
{
    fdt_note_exit_status((u32)args->arg0 & 0xff, 0);
    return 0;
}

#if defined(FDT_HAVE_signal_generate) && defined(FDT_HAVE_signal_deliver)
/* A fatal signal to a process without a handler is turned by the kernel into SIGKILL for all
 * its threads, so the dying task is delivered SIGKILL whatever was sent: remember what was sent. */
TRACEPOINT_PROBE(signal, signal_generate)
{
    if (args->sig <= 0 || args->sig >= 32 || ((1U << args->sig) & FDT_NONFATAL_SIGNAL_MASK))
        return 0;
    if (args->result != 0 && args->result != 2 && args->result != 4) /* delivered, pending, lose-info */
        return 0;
    u32 target = args->pid;
    u32 sig = args->sig;
    fatal_pending.update(&target, &sig);
    return 0;
}

TRACEPOINT_PROBE(signal, signal_deliver)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    u32 tid = (u32)id;
    if (args->sig <= 0 || args->sig >= 32)
        return 0;
    if (args->sa_handler != 0) {
        /* Handled (or ignored): it will not kill the process. */
        fatal_pending.delete(&tid);
        fatal_pending.delete(&tgid);
        return 0;
    }
    if ((1U << args->sig) & FDT_NONFATAL_SIGNAL_MASK)
        return 0;
    u32 sig = args->sig;
    if (sig == 9) {
        u32 *sent = fatal_pending.lookup(&tgid);
        if (!sent)
            sent = fatal_pending.lookup(&tid);
        if (sent)
            sig = *sent;
    }
    fdt_note_exit_status(0, sig);
    return 0;
}
#endif

#ifdef FDT_HAVE_sched_process_exit
TRACEPOINT_PROBE(sched, sched_process_exit)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    u32 tid = (u32)id;
#ifdef FDT_HAVE_GROUP_DEAD
    int group_dead = args->group_dead;
#else
    int group_dead = tid == tgid;
#endif
    if (!group_dead) {
        if (fdt_skip(tgid))
            return 0;
        struct fdt_counters *c = counters.lookup(&tgid);
        if (c)
            lock_xadd(&c->n[FDT_C_THREADS_EXITED], 1);
#ifndef FDT_ERRORS_ONLY
        struct fdt_event *e = fdt_reserve(FDT_KIND_THREAD_EXIT, 0, tgid, tid);
        if (e)
            fdt_submit(e);
#endif
        return 0;
    }

    struct fdt_exit_status *status = exit_status.lookup(&tgid);
    u32 code = 0, signal = 0, known = 0;
    if (status) {
        code = status->code;
        signal = status->signal;
        known = 1;
        exit_status.delete(&tgid);
    }
    fatal_pending.delete(&tgid);
    if (fdt_skip(tgid))
        return 0;

    struct fdt_counters *c = counters.lookup(&tgid);
    if (c) {
        struct fdt_instance_key key = {.pid = tgid, .first_ts = c->first_ts};
        struct fdt_counters final = *c;
        final.exit_ts = bpf_ktime_get_ns();
        if (exited.insert(&key, &final) != 0)
            fdt_stat(FDT_STAT_EXITED_FULL);
        counters.delete(&tgid);
    }
#ifdef FDT_STACKS
    fdt_fd_table_changed(tgid, FDT_FD_GONE);
#endif
#ifdef FDT_FOLLOW_CHILDREN
    pid_filter.delete(&tgid); /* its pid, once reused, is another process's */
#endif

#ifdef FDT_ERRORS_ONLY
    if (known && code == 0 && signal == 0)
        return 0;
#endif
    struct fdt_event *e = fdt_reserve(FDT_KIND_PROCESS_EXIT, 0, tgid, tid);
    if (!e)
        return 0;
    e->extra[FDT_X_PROCESS_EXIT_EXIT_KNOWN] = known;
    e->extra[FDT_X_PROCESS_EXIT_EXIT_CODE] = code;
    e->extra[FDT_X_PROCESS_EXIT_SIGNAL] = signal;
    fdt_submit(e);
    return 0;
}
#endif

#ifdef FDT_HAVE_mark_victim
/* Runs in the task that triggered the OOM killer: the victim comes from the arguments
 * (sizes in kB). Older kernels give only the pid. */
TRACEPOINT_PROBE(oom, mark_victim)
{
    u32 victim = args->pid;
    if (fdt_skip(victim)) /* with --pid, another process's OOM kill is not one of the traced */
        return 0;
    struct fdt_event event = {};
    struct fdt_event *e = &event;
    fdt_fill(e, FDT_KIND_OOM_KILL, 0, victim, victim);
#ifdef FDT_OOM_DETAILS
    TP_DATA_LOC_READ_CONST(&e->comm, comm, sizeof(e->comm));
    e->extra[FDT_X_OOM_KILL_TOTAL_VM_KB] = args->total_vm;
    e->extra[FDT_X_OOM_KILL_ANON_RSS_KB] = args->anon_rss;
    e->extra[FDT_X_OOM_KILL_FILE_RSS_KB] = args->file_rss;
    e->extra[FDT_X_OOM_KILL_SHMEM_RSS_KB] = args->shmem_rss;
    e->ret = args->oom_score_adj;
#else
    __builtin_memset(&e->comm, 0, sizeof(e->comm));
#endif
    fdt_emit_ending(e);
    return 0;
}
#endif
