/* TCP connections of this host becoming established, for the clock offsets between recorded
 * hosts (fdtrace.analysis.clock): the client side when the SYN-ACK arrives (SYN_SENT ->
 * ESTABLISHED), the server side when the final ACK arrives (SYN_RECV -> ESTABLISHED). The client
 * event comes first in true time, so a pair bounds the difference of the two hosts' clocks.
 *
 * Everything comes from the tracepoint's own fields (no kernel struct is read). It runs in
 * softirq context, in no particular process: the record carries pid 0 and no comm, and goes to
 * the connections table, not to the events. Loopback connections tell nothing between hosts and
 * are left out. */
#if defined(FDT_HAVE_inet_sock_set_state) && defined(FDT_CONNECTIONS)
TRACEPOINT_PROBE(sock, inet_sock_set_state)
{
    if (args->protocol != 6 || args->newstate != 1 || (args->oldstate != 2 && args->oldstate != 3))
        return 0;
    u16 family = args->family;
    if (family == 2) {
        if (args->saddr[0] == 127 || args->daddr[0] == 127)
            return 0;
    } else if (family == 10) {
        u64 high = 0, low = 0;
        __builtin_memcpy(&high, args->daddr_v6, 8);
        __builtin_memcpy(&low, args->daddr_v6 + 8, 8);
        if (high == 0 && low == 0x0100000000000000ULL)  /* ::1 */
            return 0;
    } else {
        return 0;
    }
    struct fdt_event *e = fdt_reserve(FDT_KIND_TCP_ESTABLISHED, 0, 0, 0);
    if (!e)
        return 0;
    __builtin_memset(&e->comm, 0, sizeof(e->comm));
    u64 role = args->oldstate == 2 ? 1 : 2;  /* 1 client, 2 server */
    e->ret = (s64)((role << 48) | ((u64)family << 32) | ((u64)args->sport << 16) | (u64)args->dport);
    if (family == 2) {
        __builtin_memcpy(&e->extra[0], args->saddr, 4);
        __builtin_memcpy(&e->extra[2], args->daddr, 4);
    } else {
        __builtin_memcpy(&e->extra[0], args->saddr_v6, 16);
        __builtin_memcpy(&e->extra[2], args->daddr_v6, 16);
    }
    fdt_submit(e);
    return 0;
}
#endif
