/* socket(), accept(), accept4(), connect() and close(): every call, counted exactly per process,
 * and streamed as events (only the failed ones under FDT_ERRORS_ONLY). */

static __always_inline int fdt_socket_call(long ret, u8 kind, u8 sc, s32 fd, u32 counter)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if (fdt_skip(tgid))
        return 0;
    int failed = fdt_failed(ret);
    struct fdt_counters *c = fdt_counters_for(tgid);
    if (c) {
        lock_xadd(&c->n[counter], 1);
        if (failed)
            lock_xadd(&c->n[counter + 1], 1);
    }
    if (failed)
        fdt_count_error(tgid, c, sc, ret);
#ifdef FDT_ERRORS_ONLY
    if (!failed)
        return 0;
#endif
    struct fdt_event *e = fdt_reserve(kind, sc, tgid, (u32)id);
    if (!e)
        return 0;
    e->ret = ret;
    e->fd = fd;
    if (ret < 0)
        e->errno_ = (u16)(-ret);
    fdt_submit(e);
    return 0;
}

int fdt_exit_socket(struct fdt_sys_exit_args *args)
{
    return fdt_socket_call(args->ret, FDT_KIND_SOCKET, FDT_SC_socket,
                           args->ret >= 0 ? (s32)args->ret : -1, FDT_C_SOCKETS);
}

int fdt_exit_accept(struct fdt_sys_exit_args *args)
{
    return fdt_socket_call(args->ret, FDT_KIND_ACCEPT, FDT_SC_accept,
                           args->ret >= 0 ? (s32)args->ret : -1, FDT_C_ACCEPTS);
}

int fdt_exit_accept4(struct fdt_sys_exit_args *args)
{
    return fdt_socket_call(args->ret, FDT_KIND_ACCEPT, FDT_SC_accept4,
                           args->ret >= 0 ? (s32)args->ret : -1, FDT_C_ACCEPTS);
}

/* connect() and close() return no fd: their entry stores the fd argument in the thread's slot
 * (a thread is inside one syscall at a time) and the exit takes it. */
int fdt_enter_fd_syscall(struct fdt_sys_enter_args *args)
{
    u32 slot = bpf_get_current_pid_tgid() & (FDT_TID_SLOTS - 1);
    u32 fd = (u32)args->arg0 + 1;
    entry_fd.update(&slot, &fd);
    return 0;
}

static __always_inline s32 fdt_take_fd(void)
{
    u32 slot = bpf_get_current_pid_tgid() & (FDT_TID_SLOTS - 1);
    u32 *stored = entry_fd.lookup(&slot);
    if (!stored || *stored == 0)
        return -1;
    s32 fd = (s32)(*stored - 1);
    *stored = 0;
    return fd;
}

int fdt_exit_connect(struct fdt_sys_exit_args *args)
{
    return fdt_socket_call(args->ret, FDT_KIND_CONNECT, FDT_SC_connect, fdt_take_fd(),
                           FDT_C_CONNECTS);
}

/* FDT_CLOSE_FD: the loader attached sys_enter_close to carry the fd (not under --errors-only). */
int fdt_exit_close(struct fdt_sys_exit_args *args)
{
#ifdef FDT_CLOSE_FD
    s32 fd = fdt_take_fd();
#else
    s32 fd = -1;
#endif
    return fdt_socket_call(args->ret, FDT_KIND_CLOSE, FDT_SC_close, fd, FDT_C_CLOSES);
}
