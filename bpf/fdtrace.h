/* Shared declarations of fdtrace's BPF programs.
 *
 * The numbering of event kinds, syscalls, counters and statistics slots is declared once in
 * src/fdtrace/schema.py and handed to the compiler as -D flags (FDT_KIND_*, FDT_SC_*, FDT_C_*,
 * FDT_STAT_*), together with the feature flags found by probing this kernel (FDT_HAVE_*).
 *
 * Only tracepoint arguments and BPF helpers are read here: never kernel structs, whose layout
 * bcc may take from headers of another kernel.
 */
#include <uapi/linux/ptrace.h>

#define FDT_EAGAIN 11
#define FDT_EMFILE 24
#define FDT_ENFILE 23
#define FDT_EINPROGRESS 115
#define FDT_CLONE_THREAD 0x10000ULL

/* One traced occurrence; mirrored by schema.RAW_EVENT_DTYPE (a test keeps them in step). */
struct fdt_event {
    u64 ts_ns;          /* bpf_ktime_get_ns(): CLOCK_MONOTONIC */
    u32 pid;            /* tgid */
    u32 tid;
    s64 ret;
    s32 fd;             /* -1 when the event has none */
    u8 kind;            /* FDT_KIND_* */
    u8 syscall;         /* FDT_SC_*, 0 for events that are not syscalls */
    u16 errno_;         /* positive errno, 0 on success */
    char comm[16];
    u64 extra[4];       /* kind-specific: fdtrace.schema.EXTRA_SLOTS, as FDT_X_<KIND>_<NAME> */
};

/* Exact per-process counters, keyed by tgid while the process lives. */
struct fdt_counters {
    u64 first_ts;       /* when fdtrace first saw this process: tells PID reuses apart */
    u64 exit_ts;        /* 0 while alive */
    u64 n[FDT_N_COUNTERS];
    char comm[16];
};

struct fdt_instance_key {
    u32 pid;
    u32 pad;
    u64 first_ts;
};

struct fdt_error_key {
    u32 pid;
    u8 syscall;
    u8 pad;
    u16 errno_;
    u64 first_ts;
};

struct fdt_exit_status {
    u32 code;
    u32 signal;
};

/* Layouts of the syscall tracepoints attached by hand; features.py checks the offsets against
 * this kernel's format files before attaching. */
struct fdt_sys_exit_args {
    u64 common;
    int syscall_nr;
    int pad;
    long ret;
};

struct fdt_sys_enter_args {
    u64 common;
    int syscall_nr;
    int pad;
    unsigned long arg0;
};

/* sys_enter_connect: features.py checks these offsets (fd 16, uservaddr 24, addrlen 32). */
struct fdt_sys_enter_connect_args {
    u64 common;
    int syscall_nr;
    int pad;
    unsigned long fd;
    unsigned long uservaddr;
    unsigned long addrlen;
};

/* sys_enter_accept and sys_enter_accept4: features.py checks these offsets. */
struct fdt_sys_enter_accept_args {
    u64 common;
    int syscall_nr;
    int pad;
    unsigned long fd;
    unsigned long upeer_sockaddr;
    unsigned long upeer_addrlen;
};

/* Where an accept() in flight asked the kernel to write its client's address. */
struct fdt_accept_entry {
    u64 sockaddr;
    u64 addrlen;
};

/* connect()'s destination as the caller passed it: the first 24 bytes of its sockaddr (family,
 * port, and the IPv4 or IPv6 address), read from user memory at the entry and kept by tid until
 * the exit, which puts them in the event's extra[0..2]. */
struct fdt_peer {
    u64 raw[3];
};

BPF_RINGBUF_OUTPUT(events, FDT_RING_PAGES);
/* Never written: lets user space see struct fdt_event's layout as compiled (tests compare it). */
BPF_ARRAY(event_layout, struct fdt_event, 1);
BPF_PERCPU_ARRAY(stats, u64, FDT_N_STATS);
/* Values user space sets after loading (the programs' instructions stay the same from one start
 * to the next, so they can be kept compiled): FDT_SETTING_SELF_PID, fdtrace's own process. */
#define FDT_SETTING_SELF_PID 0
#define FDT_N_SETTINGS 1
BPF_ARRAY(settings, u32, FDT_N_SETTINGS);
BPF_HASH(counters, u32, struct fdt_counters, FDT_MAX_PROCESSES);
BPF_HASH(exited, struct fdt_instance_key, struct fdt_counters, FDT_MAX_EXITED);
BPF_HASH(errors, struct fdt_error_key, u64, FDT_MAX_ERROR_KEYS);
BPF_HASH(exit_status, u32, struct fdt_exit_status, FDT_MAX_PROCESSES);
/* Fatal signal last sent to a task (by pid), see signal_generate. */
BPF_HASH(fatal_pending, u32, u32, FDT_MAX_PROCESSES);
/* fd argument of a connect() or close() in flight, +1 (0: none), indexed by tid, carried from
 * the syscall's entry to its exit; FDT_TID_SLOTS covers pid_max, so live tids never share. */
BPF_ARRAY(entry_fd, u32, FDT_TID_SLOTS);
#ifdef FDT_CONNECT_PEER
BPF_HASH(entry_peer, u32, struct fdt_peer, FDT_MAX_PEERS);
#endif
#ifdef FDT_ACCEPT_PEER
BPF_HASH(entry_accept, u32, struct fdt_accept_entry, FDT_MAX_PEERS);
#endif
#ifdef FDT_FILTER_PIDS
/* The processes traced under --pid; with FDT_FOLLOW_CHILDREN also those they start, and theirs. */
BPF_HASH(pid_filter, u32, u8, FDT_MAX_FILTERED);
#endif

static __always_inline void fdt_stat(u32 slot)
{
    u64 *v = stats.lookup(&slot);
    if (v)
        (*v)++;
}

/* fdtrace's own process is never traced: its reads of /proc would feed back into what it sees. */
static __always_inline int fdt_skip(u32 tgid)
{
    u32 slot = FDT_SETTING_SELF_PID;
    u32 *self = settings.lookup(&slot);
    if (self && *self == tgid)
        return 1;
#ifdef FDT_FILTER_PIDS
    if (!pid_filter.lookup(&tgid))
        return 1;
#endif
    return 0;
}

/* A negative return that is a real failure: would-block answers of non-blocking sockets are not. */
static __always_inline int fdt_failed(long ret)
{
    return ret < 0 && ret != -FDT_EAGAIN && ret != -FDT_EINPROGRESS;
}

static __always_inline struct fdt_counters *fdt_counters_for(u32 tgid)
{
    struct fdt_counters *c = counters.lookup(&tgid);
    if (c)
        return c;
    struct fdt_counters fresh = {};
    fresh.first_ts = bpf_ktime_get_ns();
    bpf_get_current_comm(&fresh.comm, sizeof(fresh.comm));
    counters.insert(&tgid, &fresh);
    c = counters.lookup(&tgid);
    if (!c)
        fdt_stat(FDT_STAT_COUNTERS_FULL);
    return c;
}

static __always_inline void fdt_count_error(u32 tgid, struct fdt_counters *c, u8 sc, long ret)
{
    struct fdt_error_key key = {};
    key.pid = tgid;
    key.syscall = sc;
    key.errno_ = (u16)(-ret);
    key.first_ts = c ? c->first_ts : 0;
    u64 one = 1;
    u64 *n = errors.lookup(&key);
    if (n) {
        lock_xadd(n, 1);
        return;
    }
    if (errors.insert(&key, &one) != 0) {
        n = errors.lookup(&key);
        if (n)
            lock_xadd(n, 1);
        else
            fdt_stat(FDT_STAT_ERRORS_FULL);
    }
}

/* Fills what every kind has; the caller fills the rest. */
static __always_inline void fdt_fill(struct fdt_event *e, u8 kind, u8 sc, u32 pid, u32 tid)
{
    e->ts_ns = bpf_ktime_get_ns();
    e->pid = pid;
    e->tid = tid;
    e->ret = 0;
    e->fd = -1;
    e->kind = kind;
    e->syscall = sc;
    e->errno_ = 0;
    e->extra[0] = 0;
    e->extra[1] = 0;
    e->extra[2] = 0;
    e->extra[3] = 0;
    bpf_get_current_comm(&e->comm, sizeof(e->comm));
}

/* Reserves an event and fills what every kind has; the caller fills the rest and submits. */
static __always_inline struct fdt_event *fdt_reserve(u8 kind, u8 sc, u32 pid, u32 tid)
{
    struct fdt_event *e = events.ringbuf_reserve(sizeof(struct fdt_event));
    if (!e) {
        fdt_stat(FDT_STAT_RINGBUF_FULL);
        return 0;
    }
    fdt_fill(e, kind, sc, pid, tid);
    return e;
}

static __always_inline void fdt_submit(struct fdt_event *e)
{
    events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
}

/* The rare kinds that end a process (an OOM kill, Go's thread limit) are kept here as well as
 * sent through the ring, until user space takes them (each poll, ahead of the ring): a ring that
 * a flood fills can drop events but not these, and they reach the view before the flood's
 * backlog. User space hands each (ts, pid, kind) out once, from whichever copy it reads first. */
struct fdt_ending_key {
    u64 ts_ns;
    u32 pid;
    u32 kind;
};
BPF_HASH(ending_events, struct fdt_ending_key, struct fdt_event, 1024);

static __always_inline void fdt_emit_ending(struct fdt_event *e)
{
    struct fdt_ending_key key = {};
    key.ts_ns = e->ts_ns;
    key.pid = e->pid;
    key.kind = e->kind;
    ending_events.update(&key, e); /* full (1024 not yet taken): the ring's copy is the only one */
    if (events.ringbuf_output(e, sizeof(*e), BPF_RB_NO_WAKEUP) != 0)
        fdt_stat(FDT_STAT_RINGBUF_FULL);
}
