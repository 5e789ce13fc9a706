/* --stacks (FDT_STACKS): user stacks of failed calls and of thread creation, and every descriptor a
 * traced process makes, remembered with the stack that made it until it is closed.
 *
 * A stack's id is a hash of the process and its addresses, so a process's identical stacks share
 * one entry of `stacks` and no two stacks collide on a bucket (bcc's BPF_STACK_TRACE drops a
 * stack whose bucket is taken). What does not fit is counted (stacks_full, fds_full).
 *
 * Bulk changes of a descriptor table (exec closing close-on-exec descriptors, close_range, exit)
 * are stamped in `fd_changes`; user space then drops the entries made before the stamp whose
 * descriptor is no longer open (kernel/descriptors.py). */

#ifdef FDT_STACKS
#define FDT_STACK_SCAN 128

struct fdt_stack {
    u32 tgid;
    u32 depth;          /* frames in ips */
    u64 ips[FDT_STACK_DEPTH];
    u64 scan[FDT_STACK_SCAN]; /* the words from the user stack pointer up: see fdt_user_stack */
};

struct fdt_fd_key {
    u32 tgid;
    s32 fd;
};

struct fdt_fd_made {
    u64 stack_id;       /* 0: the stack was not kept */
    u64 ts;
};

struct fdt_site {
    u64 opened;
    u64 closed;
};

struct fdt_fd_change {
    u64 changed_ts;     /* last exec or close_range: entries made before may be closed */
    u64 gone_ts;        /* the process exited: entries made before are gone */
    u64 exec_ts;        /* last exec: stacks taken before name the old program's addresses */
};

#define FDT_FD_CLOSE_RANGE 0
#define FDT_FD_GONE 1
#define FDT_FD_EXEC 2

/* The four first arguments of any syscall's entry tracepoint (8 bytes each after the number). */
struct fdt_sys_enter_args4 {
    u64 common;
    int syscall_nr;
    int pad;
    unsigned long arg[4];
};

/* A stack's innermost frames, walked by hand, name the stack taken the first time they were seen. */
struct fdt_prefix_site {
    u64 stack_id;
    u32 tgid;
    u32 pad;
};

#define FDT_PREFIX_FRAMES 8         /* frames walked by hand: the key of a call site */
#define FDT_PREFIX_MIN 2            /* fewer valid frames than this: no key, the whole stack is taken */
#define FDT_STACK_SPAN (8ULL << 20) /* a frame pointer lies this close above the stack pointer */

BPF_PERCPU_ARRAY(stack_scratch, struct fdt_stack, 1);
BPF_HASH(stacks, u64, struct fdt_stack, FDT_MAX_STACKS);
BPF_HASH(prefix_sites, u64, struct fdt_prefix_site, FDT_MAX_STACKS);
BPF_HASH(live_fds, struct fdt_fd_key, struct fdt_fd_made, FDT_MAX_FDS);
BPF_HASH(fd_sites, u64, struct fdt_site, FDT_MAX_STACKS);
BPF_HASH(fd_changes, u32, struct fdt_fd_change, FDT_MAX_PROCESSES);
/* pipe()'s and socketpair()'s int[2], or fcntl()'s command, kept by tid from entry to exit */
BPF_HASH(fd_call_arg, u32, u64, FDT_MAX_PEERS);

#define FDT_CALLER_WORDS 32          /* words from the stack pointer searched for the wrapper's caller */
#define FDT_WRAPPER_SPAN 4096        /* a syscall wrapper's syscall lies this close after its start */

static __always_inline s64 fdt_s32_at(const u8 *b)
{
    return (s32)((u32)b[0] | (u32)b[1] << 8 | (u32)b[2] << 16 | (u32)b[3] << 24);
}

/* Where the call that returns to `ret` went: a near call's target, followed once through a PLT
 * stub ([endbr64] [bnd] jmp *disp(%rip)) to the function its GOT slot holds; or the function a
 * call *disp(%rip) (code built with -fno-plt) read from its slot. 0: not a call this can follow
 * (a call through a register, or a word that is no return address at all). */
static __always_inline u64 fdt_call_target(u64 ret)
{
    u8 b[6];
    if (ret < 4096 || bpf_probe_read_user(b, sizeof(b), (void *)(ret - 6)) != 0)
        return 0;
    u64 target = 0;
    if (b[0] == 0xFF && b[1] == 0x15) {
        if (bpf_probe_read_user(&target, sizeof(target), (void *)(ret + fdt_s32_at(&b[2]))) != 0)
            return 0;
        return target;
    }
    if (b[1] != 0xE8)
        return 0;
    target = ret + fdt_s32_at(&b[2]);
    u8 stub[11];
    if (bpf_probe_read_user(stub, sizeof(stub), (void *)target) != 0)
        return 0;
    u32 at = 0;
    if (stub[0] == 0xF3 && stub[1] == 0x0F && stub[2] == 0x1E && stub[3] == 0xFA) {
        at = stub[4] == 0xF2 ? 5 : 4;
    } else if (stub[0] == 0xF2) {
        at = 1;
    }
    s64 disp;
    if (at == 0 && stub[0] == 0xFF && stub[1] == 0x25)
        disp = fdt_s32_at(&stub[2]);
    else if (at == 1 && stub[1] == 0xFF && stub[2] == 0x25)
        disp = fdt_s32_at(&stub[3]);
    else if (at == 4 && stub[4] == 0xFF && stub[5] == 0x25)
        disp = fdt_s32_at(&stub[6]);
    else if (at == 5 && stub[5] == 0xFF && stub[6] == 0x25)
        disp = fdt_s32_at(&stub[7]);
    else
        return target; /* a call straight to the function */
    u64 bound = 0;
    if (bpf_probe_read_user(&bound, sizeof(bound), (void *)(target + at + 6 + disp)) != 0)
        return 0;
    return bound;
}

struct fdt_caller_key {
    u32 tgid;
    u32 pad;
    u64 ip;
};

/* Where the wrapper's return address lies above the stack pointer (in words), by process and
 * syscall instruction: fixed for an instruction (a wrapper allocates no stack dynamically), so it
 * is found once and then read straight away, checked only to follow a call. Least recently used
 * entries go first (those of processes gone); one that no longer holds a return address (an exec,
 * a reused pid) is searched again. */
BPF_TABLE("lru_hash", struct fdt_caller_key, u32, caller_slots, FDT_MAX_STACKS);

/* The return address of the call into the syscall wrapper that `ip` lies in: the first of the
 * words from the stack pointer up that returns from a call whose target starts at most
 * FDT_WRAPPER_SPAN bytes before `ip`. A wrapper that pushes registers or keeps locals (libc's
 * cancellable calls: open, accept, connect) puts it a few words up, and what lies between (saved
 * registers, stale return addresses of earlier calls) is no part of a call site's identity.
 * `words`: scratch for FDT_CALLER_WORDS words. 0: none found (a call through a register, or a PLT
 * slot not bound yet: searched again next time). */
static __always_inline u64 fdt_wrapper_caller(u64 *words, u32 tgid, u64 ip, u64 sp)
{
    struct fdt_caller_key key = {.tgid = tgid, .ip = ip};
    u32 *slot = caller_slots.lookup(&key);
    u64 word = 0;
    if (slot) {
        u8 b[6] = {};
        if (*slot < FDT_CALLER_WORDS && bpf_probe_read_user(&word, sizeof(word), (void *)(sp + *slot * 8)) == 0
            && word >= 4096 && bpf_probe_read_user(b, sizeof(b), (void *)(word - 6)) == 0
            && (b[1] == 0xE8 || (b[0] == 0xFF && b[1] == 0x15)))
            return word;
        /* no return address there: the process exec'd, or its pid is another's now */
        caller_slots.delete(&key);
    }
    if (bpf_probe_read_user(words, FDT_CALLER_WORDS * sizeof(u64), (void *)sp) != 0)
        return 0;
    for (u32 i = 0; i < FDT_CALLER_WORDS; i++) {
        word = words[i];
        if (word < 4096)
            continue;
        u64 target = fdt_call_target(word);
        if (target && target <= ip && ip - target < FDT_WRAPPER_SPAN) {
            caller_slots.update(&key, &i);
            return word;
        }
    }
    return 0;
}

/* The hash of the process, the wrapper's caller and its innermost frames, walked along the frame
 * pointers from the user registers while each frame lies above the last and within
 * FDT_STACK_SPAN of the stack pointer; 0 when fewer than FDT_PREFIX_MIN frames are valid (a
 * wrapper that uses the frame pointer as a register). A few reads of user memory: about a third
 * of what bpf_get_stack costs. */
static __always_inline u64 fdt_prefix_key(u32 tgid, u64 ip, u64 caller, u64 sp, u64 bp)
{
    u64 h = 14695981039346656037ULL ^ tgid;
    h = (h ^ ip) * 1099511628211ULL;
    /* The wrapper's caller, which tells two callers apart where the frame pointers do not: a
     * wrapper makes no frame, so the walk goes from it straight to its caller's caller. */
    h = (h ^ caller) * 1099511628211ULL;
    u32 frames = 1;
    for (int i = 0; i < FDT_PREFIX_FRAMES - 1; i++) {
        if (bp < sp || bp >= sp + FDT_STACK_SPAN || (bp & 7))
            break;
        u64 frame[2]; /* the caller's frame pointer, the return address */
        if (bpf_probe_read_user(frame, sizeof(frame), (void *)bp) != 0)
            break;
        h = (h ^ frame[1]) * 1099511628211ULL;
        frames++;
        if (frame[0] <= bp)
            break;
        bp = frame[0];
    }
    return frames >= FDT_PREFIX_MIN ? (h | 1) : 0;
}

/* The calling thread's user stack, kept once per (process, wrapper's caller, stack); returns its
 * id or 0.
 *
 * With FDT_STACK_TOP (bpf_task_pt_regs), a call whose innermost FDT_PREFIX_FRAMES frames and
 * wrapper's caller were seen before gets the id of the stack taken then, without a new walk
 * (stacks that differ only deeper share it); and the first words from the user stack pointer are
 * kept with a new stack: a libc syscall wrapper makes no frame of its own, so a frame-pointer walk
 * goes from the wrapper straight to its caller's caller, and user space finds the wrapper's return
 * address among them (kernel/stacks.py). The id holds that caller too (fdt_wrapper_caller): two
 * functions reached through one indirect call differ in nothing else. pt_regs is the
 * architecture's syscall-entry layout, stable for years. */
static __always_inline u64 fdt_user_stack(void *ctx, u32 tgid)
{
    u64 prefix = 0, sp = 0, caller = 0;
    u32 zero = 0;
    struct fdt_stack *s = stack_scratch.lookup(&zero);
    if (!s)
        return 0;
#ifdef FDT_STACK_TOP
    struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
    struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
    u64 ip = 0, bp = 0;
    bpf_probe_read_kernel(&sp, sizeof(sp), &PT_REGS_SP(regs));
    bpf_probe_read_kernel(&ip, sizeof(ip), &PT_REGS_IP(regs));
    bpf_probe_read_kernel(&bp, sizeof(bp), &PT_REGS_FP(regs));
    caller = fdt_wrapper_caller(s->scan, tgid, ip, sp);
    prefix = fdt_prefix_key(tgid, ip, caller, sp, bp);
    if (prefix) {
        struct fdt_prefix_site *known = prefix_sites.lookup(&prefix);
        if (known)
            return known->stack_id;
    }
#endif
    long n = bpf_get_stack(ctx, s->ips, sizeof(s->ips), BPF_F_USER_STACK);
    if (n <= 0) {
        fdt_stat(FDT_STAT_STACKS_FULL);
        return 0;
    }
    u32 depth = (u32)n / 8;
    u64 h = 14695981039346656037ULL ^ tgid; /* FNV-1a over the process, the caller and the frames */
    h = (h ^ caller) * 1099511628211ULL;
    for (int i = 0; i < FDT_STACK_DEPTH; i++) {
        if (i >= depth)
            break;
        h = (h ^ s->ips[i]) * 1099511628211ULL;
    }
    if (h == 0)
        h = 1;
    if (!stacks.lookup(&h)) {
        s->tgid = tgid;
        s->depth = depth;
        __builtin_memset(s->scan, 0, sizeof(s->scan));
        if (sp)
            bpf_probe_read_user(s->scan, sizeof(s->scan), (void *)sp);
        if (stacks.insert(&h, s) != 0 && !stacks.lookup(&h)) {
            fdt_stat(FDT_STAT_STACKS_FULL);
            return 0;
        }
    }
    if (prefix) {
        struct fdt_prefix_site site = {.stack_id = h, .tgid = tgid};
        prefix_sites.update(&prefix, &site);
    }
    return h;
}

/* fd_sites counts what each stack made and closed since user space last took the counts (it
 * takes and deletes them at once, every round): a missing entry is made by either side. */
static __always_inline void fdt_site_count(u64 stack_id, int closed)
{
    if (!stack_id)
        return;
    struct fdt_site *site = fd_sites.lookup(&stack_id);
    if (!site) {
        struct fdt_site fresh = {};
        if (fd_sites.insert(&stack_id, &fresh) != 0 && !fd_sites.lookup(&stack_id)) {
            fdt_stat(FDT_STAT_STACKS_FULL);
            return;
        }
        site = fd_sites.lookup(&stack_id);
        if (!site)
            return;
    }
    if (closed)
        lock_xadd(&site->closed, 1);
    else
        lock_xadd(&site->opened, 1);
}

static __always_inline void fdt_site_closed(u64 stack_id)
{
    fdt_site_count(stack_id, 1);
}

/* A descriptor made by the process: remembered with its stack (replacing, and closing, the entry
 * of a descriptor dup2() made over). */
static __always_inline void fdt_fd_remember(u32 tgid, s32 fd, u64 stack_id)
{
    if (fd < 0)
        return;
    struct fdt_fd_key key = {.tgid = tgid, .fd = fd};
    struct fdt_fd_made *before = live_fds.lookup(&key);
    if (before)
        fdt_site_closed(before->stack_id);
    struct fdt_fd_made made = {.stack_id = stack_id, .ts = bpf_ktime_get_ns()};
    if (live_fds.update(&key, &made) != 0) {
        fdt_stat(FDT_STAT_FDS_FULL);
        return;
    }
    fdt_site_count(stack_id, 0);
}

static __always_inline void fdt_fd_made_now(void *ctx, u32 tgid, s32 fd)
{
    if (fd >= 0)
        fdt_fd_remember(tgid, fd, fdt_user_stack(ctx, tgid));
}

static __always_inline void fdt_fd_forget(u32 tgid, s32 fd)
{
    struct fdt_fd_key key = {.tgid = tgid, .fd = fd};
    struct fdt_fd_made *made = live_fds.lookup(&key);
    if (!made)
        return;
    fdt_site_closed(made->stack_id);
    live_fds.delete(&key);
}

static __always_inline void fdt_fd_table_changed(u32 tgid, int how)
{
    struct fdt_fd_change *change = fd_changes.lookup(&tgid);
    struct fdt_fd_change fresh = {};
    if (!change)
        change = &fresh;
    u64 now = bpf_ktime_get_ns();
    if (how == FDT_FD_GONE) {
        change->gone_ts = now;
    } else {
        change->changed_ts = now;
        if (how == FDT_FD_EXEC)
            change->exec_ts = now;
    }
    if (change == &fresh)
        fd_changes.update(&tgid, &fresh);
}

/* The entries of pipe()/pipe2() (where the two fds go), socketpair() (likewise) and fcntl() (the
 * command: only F_DUPFD and F_DUPFD_CLOEXEC make a descriptor). */
static __always_inline int fdt_keep_call_arg(u64 value)
{
    u64 id = bpf_get_current_pid_tgid();
    if (fdt_skip(id >> 32))
        return 0;
    u32 tid = (u32)id;
    if (fd_call_arg.update(&tid, &value) != 0)
        fdt_stat(FDT_STAT_FDS_FULL);
    return 0;
}

int fdt_enter_pipe(struct fdt_sys_enter_args4 *args)
{
    return fdt_keep_call_arg(args->arg[0]);
}

int fdt_enter_socketpair(struct fdt_sys_enter_args4 *args)
{
    return fdt_keep_call_arg(args->arg[3]);
}

int fdt_enter_fcntl(struct fdt_sys_enter_args4 *args)
{
    return fdt_keep_call_arg(args->arg[1]);
}

int fdt_exit_close_range(struct fdt_sys_exit_args *args)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (args->ret == 0 && !fdt_skip(tgid))
        fdt_fd_table_changed(tgid, FDT_FD_CLOSE_RANGE);
    return 0;
}

/* A successful call of an fd-allocating syscall other than socket/accept (fd_errors.bpf.c). */
static __always_inline void fdt_fd_alloc_made(void *ctx, long ret, u8 sc)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if (sc == FDT_SC_pipe || sc == FDT_SC_pipe2 || sc == FDT_SC_socketpair || sc == FDT_SC_fcntl) {
        u32 tid = (u32)id;
        u64 *kept = fd_call_arg.lookup(&tid);
        if (!kept)
            return;
        u64 arg = *kept;
        fd_call_arg.delete(&tid);
        if (sc == FDT_SC_fcntl) {
            if (arg != 0 && arg != 1030) /* F_DUPFD, F_DUPFD_CLOEXEC */
                return;
        } else {
            int fds[2] = {-1, -1};
            if (ret != 0 || bpf_probe_read_user(fds, sizeof(fds), (void *)arg) != 0)
                return;
            u64 stack_id = fdt_user_stack(ctx, tgid);
            fdt_fd_remember(tgid, fds[0], stack_id);
            fdt_fd_remember(tgid, fds[1], stack_id);
            return;
        }
    }
    /* These return 0 or another number on success for most of their uses, not a descriptor. */
    if (sc == FDT_SC_bpf || sc == FDT_SC_seccomp || sc == FDT_SC_landlock_create_ruleset)
        return;
    if (fdt_skip(tgid))
        return;
    fdt_fd_made_now(ctx, tgid, (s32)ret);
}
#endif
