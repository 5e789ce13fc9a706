/* socket(), accept(), accept4(), connect() and close(): every call, counted exactly per process,
 * and streamed as events (only the failed ones under FDT_ERRORS_ONLY). */

static __always_inline int fdt_socket_call(void *ctx, long ret, u8 kind, u8 sc, s32 fd, u32 counter,
                                           const struct fdt_peer *peer)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if (fdt_skip(tgid))
        return 0;
    int failed = fdt_failed(ret);
#ifdef FDT_STACKS
    /* --stacks: the stack of a failed connect or accept and of any EMFILE/ENFILE goes with the
     * event; a socket or accepted connection made is remembered with its own. */
    u64 stack_id = 0;
    if (failed && (kind == FDT_KIND_CONNECT || kind == FDT_KIND_ACCEPT || ret == -FDT_EMFILE || ret == -FDT_ENFILE))
        stack_id = fdt_user_stack(ctx, tgid);
    else if (ret >= 0 && (kind == FDT_KIND_SOCKET || kind == FDT_KIND_ACCEPT))
        fdt_fd_made_now(ctx, tgid, (s32)ret);
    else if (ret == 0 && kind == FDT_KIND_CLOSE && fd >= 0)
        fdt_fd_forget(tgid, fd);
#endif
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
    if (peer) {
        e->extra[FDT_X_CONNECT_SOCKADDR0] = peer->raw[0];
        e->extra[FDT_X_CONNECT_SOCKADDR1] = peer->raw[1];
        e->extra[FDT_X_CONNECT_SOCKADDR2] = peer->raw[2];
    }
#ifdef FDT_STACKS
    e->extra[FDT_X_STACK] = stack_id;
#endif
    fdt_submit(e);
    return 0;
}

int fdt_exit_socket(struct fdt_sys_exit_args *args)
{
    return fdt_socket_call(args, args->ret, FDT_KIND_SOCKET, FDT_SC_socket,
                           args->ret >= 0 ? (s32)args->ret : -1, FDT_C_SOCKETS, 0);
}

/* FDT_ACCEPT_PEER (not under --errors-only): accept()'s entry keeps where the caller wants the
 * client's address; the exit reads what the kernel wrote there. */
int fdt_enter_accept(struct fdt_sys_enter_accept_args *args)
{
#ifdef FDT_ACCEPT_PEER
    u64 id = bpf_get_current_pid_tgid();
    if (fdt_skip(id >> 32) || !args->upeer_sockaddr || !args->upeer_addrlen)
        return 0;
    struct fdt_accept_entry entry = {.sockaddr = args->upeer_sockaddr, .addrlen = args->upeer_addrlen};
    u32 tid = (u32)id;
    if (entry_accept.update(&tid, &entry) != 0)
        fdt_stat(FDT_STAT_PEERS_FULL);
#endif
    return 0;
}

static __always_inline int fdt_accept_exit(void *ctx, long ret, u8 sc)
{
    s32 fd = ret >= 0 ? (s32)ret : -1;
#ifdef FDT_ACCEPT_PEER
    u32 tid = (u32)bpf_get_current_pid_tgid();
    struct fdt_accept_entry *entry = entry_accept.lookup(&tid);
    if (entry) {
        struct fdt_accept_entry where = *entry;
        entry_accept.delete(&tid);
        struct fdt_peer peer = {};
        int len = 0;
        int read = -1;
        if (ret >= 0 && bpf_probe_read_user(&len, sizeof(len), (void *)where.addrlen) == 0) {
            /* the address's own length, as the kernel wrote it back; the first 24 bytes at most */
            if (len >= 24)
                read = bpf_probe_read_user(&peer, 24, (void *)where.sockaddr);
            else if (len >= 16)
                read = bpf_probe_read_user(&peer, 16, (void *)where.sockaddr);
            else if (len >= 2)
                read = bpf_probe_read_user(&peer, 2, (void *)where.sockaddr);
        }
        if (read == 0)
            return fdt_socket_call(ctx, ret, FDT_KIND_ACCEPT, sc, fd, FDT_C_ACCEPTS, &peer);
    }
#endif
    return fdt_socket_call(ctx, ret, FDT_KIND_ACCEPT, sc, fd, FDT_C_ACCEPTS, 0);
}

int fdt_exit_accept(struct fdt_sys_exit_args *args)
{
    return fdt_accept_exit(args, args->ret, FDT_SC_accept);
}

int fdt_exit_accept4(struct fdt_sys_exit_args *args)
{
    return fdt_accept_exit(args, args->ret, FDT_SC_accept4);
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

/* connect()'s entry: its fd, and (FDT_CONNECT_PEER) the destination address. */
int fdt_enter_connect(struct fdt_sys_enter_connect_args *args)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 slot = id & (FDT_TID_SLOTS - 1);
    u32 fd = (u32)args->fd + 1;
    entry_fd.update(&slot, &fd);
#ifdef FDT_CONNECT_PEER
    if (fdt_skip(id >> 32))
        return 0;
    struct fdt_peer peer = {};
    /* 16 bytes hold an IPv4 sockaddr; an IPv6 one, 28 long, has its address within 24; a
     * shorter one (an abstract Unix name) gives its family. Never past the caller's addrlen. */
    if (args->addrlen >= 16) {
        if (bpf_probe_read_user(&peer, 16, (void *)args->uservaddr) != 0)
            return 0;
        if ((peer.raw[0] & 0xffff) == 10 && args->addrlen >= 24)
            bpf_probe_read_user(&peer, 24, (void *)args->uservaddr);
    } else if (args->addrlen < 2 || bpf_probe_read_user(&peer, 2, (void *)args->uservaddr) != 0) {
        return 0;
    }
    u32 tid = (u32)id;
    if (entry_peer.update(&tid, &peer) != 0)
        fdt_stat(FDT_STAT_PEERS_FULL);
#endif
    return 0;
}

int fdt_exit_connect(struct fdt_sys_exit_args *args)
{
    s32 fd = fdt_take_fd();
#ifdef FDT_CONNECT_PEER
    u32 tid = (u32)bpf_get_current_pid_tgid();
    struct fdt_peer *stored = entry_peer.lookup(&tid);
    if (stored) {
        struct fdt_peer peer = *stored;
        entry_peer.delete(&tid);
        return fdt_socket_call(args, args->ret, FDT_KIND_CONNECT, FDT_SC_connect, fd, FDT_C_CONNECTS, &peer);
    }
#endif
    return fdt_socket_call(args, args->ret, FDT_KIND_CONNECT, FDT_SC_connect, fd, FDT_C_CONNECTS, 0);
}

/* FDT_CLOSE_FD: the loader attached sys_enter_close to carry the fd (not under --errors-only). */
int fdt_exit_close(struct fdt_sys_exit_args *args)
{
#ifdef FDT_CLOSE_FD
    s32 fd = fdt_take_fd();
#else
    s32 fd = -1;
#endif
    return fdt_socket_call(args, args->ret, FDT_KIND_CLOSE, FDT_SC_close, fd, FDT_C_CLOSES, 0);
}
