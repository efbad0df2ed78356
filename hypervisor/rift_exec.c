/*
 * rift-exec: the guest half of Rift's execs (SPEC §10). A static binary that
 * Rift's images carry at /usr/lib/rift/rift-exec (and that Rift uploads to
 * guests it did not build). Rift runs it over SSH; the command it starts runs
 * detached, in a session and process group of its own, and outlives the SSH
 * channel, the connection and Rift itself.
 *
 *   rift-exec start DIR TIMEOUT_S CAP WAIT_MS MAX [--clock=CS] [--stdin] -- COMMAND
 *       With --clock, first set the guest's clock to CS (hundredths of a second
 *       since the epoch, Rift's clock when it sent this; a woken guest's clock
 *       is the one it slept with), here rather than in a `date -s` before this:
 *       after a restore, each program started costs QEMU translating it anew.
 *       Make DIR and fork the exec's keeper, which starts `$SHELL -c COMMAND`
 *       (else /bin/sh); wait up to WAIT_MS for its end, print the view (below)
 *       with its output from offset 0, and exit (so the SSH channel ends as
 *       any other). The keeper, in a session of its own, collects the output
 *       into DIR/out and DIR/err
 *       (rings holding the newest CAP bytes of each), feeds its stdin, kills
 *       its process group at TIMEOUT_S (TERM, then KILL 5 s later), and writes
 *       DIR/status once the command and its group are gone. With --stdin, the
 *       channel's stdin (read to its end first) is the command's, then EOF;
 *       without, stdin stays open for `input`.
 *   rift-exec read DIR OUT_OFF ERR_OFF MAX WAIT_MS
 *       Print the view with up to MAX bytes of each stream from the offsets,
 *       once there is output past them or the exec ended, or WAIT_MS passed.
 *   rift-exec input DIR [--eof]
 *       Copy this stdin to the command's; with --eof, close it after.
 *   rift-exec kill DIR TERM|KILL
 *       Signal the command's process group (TERM: KILL follows after 5 s).
 *   rift-exec identity DIR MAC NOW_CS SETTLE_MS KEY PIDFILE [-- RESTART...]
 *       Make a fork of a saved VM its own (root only), in this one process:
 *       stdin holds a line of hex (fresh bytes of Rift's host), then the public
 *       key line and the private key of a new SSH host key (both empty when the
 *       key is in place already). The key goes to KEY and KEY.pub (written
 *       aside, then renamed); MAC (aa:bb:cc:dd:ee:ff, or - to keep it) onto the
 *       first network interface but lo; the bytes into the kernel's input pool,
 *       and its random number generator reseeded from it (RNDRESEEDCRNG: a fork
 *       would else go on with its source's generator state); the clock to
 *       NOW_CS (hundredths of a second since the epoch, Rift's clock when it
 *       sent this) plus the time since this began. Then, SETTLE_MS later and in
 *       the background, the SSH server starts anew with the new key: without
 *       RESTART, a hangup to the process PIDFILE names (sshd re-executes
 *       itself); with it, that process is stopped and RESTART run (or RESTART
 *       alone, PIDFILE -). DIR is not used.
 *
 * The view: one line, then the stdout bytes, then the stderr bytes:
 *   rift-exec state=running|ended|lost code=N signal=N timed_out=0|1
 *   killed=0|1 stdin=open|closed started=MS ended=MS out_total=N err_total=N
 *   out_from=N out_len=N err_from=N err_len=N
 * (MS: milliseconds since the epoch, guest clock; `lost`: the keeper died
 * without writing the status). Exit status: 0 done, 2 usage, 3 no such exec,
 * 4 the exec ended (input), 5 its stdin is closed (input), 1 other failure
 * (identity: 10 + the step that failed, its reason on stderr).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <net/if.h>
#include <net/if_arp.h>
#include <sys/socket.h>
#include <linux/random.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define KILL_GRACE_MS 5000
#define DRAIN_MS 200
#define POLL_MS 5
#define FRAME_MAX 4096 /* <= PIPE_BUF: a frame is written in one piece */
#define PENDING_MAX ((16 << 20) + 2 * FRAME_MAX) /* Rift's stdin cap, 16 MiB */

static const char *dir;

static int64_t clock_ms(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}
static int64_t now_ms(void) { return clock_ms(CLOCK_REALTIME); }
static int64_t mono_ms(void) { return clock_ms(CLOCK_MONOTONIC); }

static const char *at(const char *name) {
    static char buf[4][PATH_MAX];
    static int i;
    i = (i + 1) % 4;
    snprintf(buf[i], PATH_MAX, "%s/%s", dir, name);
    return buf[i];
}

static void die(int code, const char *what) {
    fprintf(stderr, "rift-exec: %s: %s\n", what, errno ? strerror(errno) : "failed");
    exit(code);
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

static int write_all(int fd, const void *data, size_t n) {
    const char *p = data;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int read_text(const char *path, char *buf, size_t size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, size - 1);
    close(fd);
    if (n < 0) return -1;
    buf[n] = 0;
    return 0;
}

static void write_text_atomic(const char *name, const char *text) {
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s.tmp", at(name));
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return;
    write_all(fd, text, strlen(text));
    close(fd);
    rename(tmp, at(name));
}

/* -- rings: [u64 bytes written so far][CAP bytes: byte i at 8 + i % CAP] -------- */

struct ring {
    int fd;
    uint64_t cap, total;
};

static void ring_make(struct ring *r, const char *name, uint64_t cap) {
    r->fd = open(at(name), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (r->fd < 0 || ftruncate(r->fd, (off_t)(8 + cap)) < 0) die(1, name);
    r->cap = cap;
    r->total = 0;
}

static void ring_put(struct ring *r, const char *data, size_t n) {
    if (n > r->cap) { /* only the newest CAP bytes are kept */
        r->total += n - r->cap;
        data += n - r->cap;
        n = r->cap;
    }
    uint64_t pos = r->total % r->cap;
    size_t first = n < r->cap - pos ? n : (size_t)(r->cap - pos);
    if (pwrite(r->fd, data, first, (off_t)(8 + pos)) < 0) return;
    if (n > first && pwrite(r->fd, data + first, n - first, 8) < 0) return;
    r->total += n;
    if (pwrite(r->fd, &r->total, 8, 0) < 0) return;
}

static int ring_open(const char *name, uint64_t *cap) {
    int fd = open(at(name), O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0 || st.st_size <= 8) die(3, "no such exec");
    *cap = (uint64_t)st.st_size - 8;
    return fd;
}

static uint64_t ring_total(int fd) {
    uint64_t t = 0;
    if (pread(fd, &t, 8, 0) != 8) return 0;
    return t;
}

/* Up to `max` bytes from offset `off` (or from the oldest kept) into `buf`. */
static size_t ring_get(int fd, uint64_t cap, uint64_t off, size_t max, char *buf,
                       uint64_t *from, uint64_t *total) {
    uint64_t t = ring_total(fd);
    uint64_t lo = t > cap ? t - cap : 0;
    uint64_t f = off > t ? t : (off < lo ? lo : off);
    size_t n = t - f < max ? (size_t)(t - f) : max;
    size_t done = 0;
    while (done < n) {
        uint64_t pos = (f + done) % cap;
        size_t part = n - done < cap - pos ? n - done : (size_t)(cap - pos);
        ssize_t got = pread(fd, buf + done, part, (off_t)(8 + pos));
        if (got <= 0) break;
        done += (size_t)got;
    }
    n = done;
    uint64_t t2 = ring_total(fd), lo2 = t2 > cap ? t2 - cap : 0;
    if (lo2 > f) { /* overwritten while read: drop what is no longer the stream's */
        uint64_t skip = lo2 - f;
        if (skip >= n) {
            n = 0;
        } else {
            memmove(buf, buf + skip, n - (size_t)skip);
            n -= (size_t)skip;
        }
        f = lo2;
    }
    *from = f;
    *total = t;
    return n;
}

/* -- the view --------------------------------------------------------------- */

struct facts {
    int ended, lost, code, sig, timed_out, killed, stdin_open;
    long long started, ended_ms;
};

/* Whether the process runs (a zombie does not). */
static int alive(pid_t pid) {
    char path[64], text[512];
    if (pid <= 0) return 0;
    snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
    if (read_text(path, text, sizeof text) < 0) return 0;
    char *close_paren = strrchr(text, ')');
    return close_paren && close_paren[1] == ' ' && close_paren[2] != 'Z';
}

static void read_facts(struct facts *f) {
    char text[256];
    memset(f, 0, sizeof *f);
    f->code = f->sig = -1;
    long long keeper = 0, child = 0;
    if (read_text(at("pid"), text, sizeof text) < 0) die(3, "no such exec");
    sscanf(text, "%lld %lld %lld", &keeper, &child, &f->started);
    if (read_text(at("status"), text, sizeof text) == 0) {
        f->ended = 1;
        sscanf(text, "%d %d %d %d %lld", &f->code, &f->sig, &f->timed_out, &f->killed,
               &f->ended_ms);
    } else if (!alive((pid_t)keeper)) {
        f->lost = 1; /* the keeper died (the status may just have landed: look again) */
        if (read_text(at("status"), text, sizeof text) == 0) return read_facts(f);
    }
    f->stdin_open = !f->ended && !f->lost && access(at("eof"), F_OK) != 0;
}

static void print_view(uint64_t out_off, uint64_t err_off, size_t max) {
    struct facts f;
    read_facts(&f);
    uint64_t out_cap, err_cap, out_from, err_from, out_total, err_total;
    int out_fd = ring_open("out", &out_cap), err_fd = ring_open("err", &err_cap);
    char *out = malloc(max + 1), *err = malloc(max + 1);
    if (!out || !err) die(1, "out of memory");
    size_t out_len = ring_get(out_fd, out_cap, out_off, max, out, &out_from, &out_total);
    size_t err_len = ring_get(err_fd, err_cap, err_off, max, err, &err_from, &err_total);
    printf("rift-exec state=%s code=%d signal=%d timed_out=%d killed=%d stdin=%s "
           "started=%lld ended=%lld out_total=%llu err_total=%llu out_from=%llu "
           "out_len=%zu err_from=%llu err_len=%zu\n",
           f.ended ? "ended" : f.lost ? "lost" : "running", f.code, f.sig, f.timed_out,
           f.killed, f.stdin_open ? "open" : "closed", f.started, f.ended_ms,
           (unsigned long long)out_total, (unsigned long long)err_total,
           (unsigned long long)out_from, out_len, (unsigned long long)err_from, err_len);
    fflush(stdout);
    write_all(1, out, out_len);
    write_all(1, err, err_len);
    free(out);
    free(err);
    close(out_fd);
    close(err_fd);
}

/* Wait until the exec ended (or its keeper is gone), or past the offsets, or
 * `wait_ms` passed. */
static void wait_for(uint64_t out_off, uint64_t err_off, int64_t wait_ms) {
    uint64_t cap;
    int out_fd = ring_open("out", &cap), err_fd = ring_open("err", &cap);
    int64_t deadline = mono_ms() + wait_ms;
    for (;;) {
        struct facts f;
        read_facts(&f);
        if (f.ended || f.lost || ring_total(out_fd) > out_off || ring_total(err_fd) > err_off)
            break;
        int64_t left = deadline - mono_ms();
        if (left <= 0) break;
        sleep_ms(left < POLL_MS ? (int)left : POLL_MS);
    }
    close(out_fd);
    close(err_fd);
}

/* -- the keeper --------------------------------------------------------------- */

static int sig_pipe[2];
static void on_child(int sig) {
    (void)sig;
    int saved = errno;
    (void)!write(sig_pipe[1], "c", 1);
    errno = saved;
}

struct keeper {
    pid_t child;
    struct ring out, err;
    int out_fd, err_fd, in_fd; /* pipes from and to the command; -1 once closed */
    int fifo, ctl;             /* DIR/stdin (frames) and DIR/ctl (T or K) */
    char frame[FRAME_MAX * 2];
    size_t frame_len;
    char *pending; /* stdin bytes waiting for the command to read them */
    size_t pending_len;
    int eof_asked, timed_out, killed, exited, status;
    int64_t deadline, kill_at, ended;
    int ready_fd; /* the caller's pipe: one byte once DIR/pid is written, then closed */
};

static void signal_group(struct keeper *k, int sig) { kill(-k->child, sig); }

static void ask_kill(struct keeper *k, int sig) {
    signal_group(k, sig);
    if (sig == SIGTERM && k->kill_at == 0) k->kill_at = mono_ms() + KILL_GRACE_MS;
}

static void close_stdin(struct keeper *k) {
    if (k->in_fd >= 0) close(k->in_fd);
    k->in_fd = -1;
    k->pending_len = 0;
    int fd = open(at("eof"), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0) close(fd);
}

static void take_frames(struct keeper *k) {
    size_t at_ = 0;
    while (k->frame_len - at_ >= 2) {
        size_t len = (unsigned char)k->frame[at_] | ((size_t)(unsigned char)k->frame[at_ + 1] << 8);
        if (k->frame_len - at_ < 2 + len) break;
        if (len == 0) {
            k->eof_asked = 1;
        } else if (k->in_fd >= 0 && !k->eof_asked) {
            memcpy(k->pending + k->pending_len, k->frame + at_ + 2, len);
            k->pending_len += len;
        }
        at_ += 2 + len;
    }
    memmove(k->frame, k->frame + at_, k->frame_len - at_);
    k->frame_len -= at_;
}

static void drain(struct keeper *k, int *fd, struct ring *r) {
    char buf[65536];
    for (;;) {
        ssize_t n = read(*fd, buf, sizeof buf);
        if (n > 0) {
            ring_put(r, buf, (size_t)n);
            if ((size_t)n < sizeof buf) return;
            continue;
        }
        if (n < 0 && (errno == EINTR)) continue;
        if (n < 0 && errno == EAGAIN) return;
        close(*fd);
        *fd = -1;
        return;
    }
    (void)k;
}

/* The keeper is its command's subreaper: it reaps the command and every orphan
 * of it, so none lingers as a zombie of its process group. */
static void reap(struct keeper *k) {
    int st;
    pid_t pid;
    while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
        if (pid == k->child && !k->exited) {
            k->exited = 1;
            k->status = st;
            k->ended = now_ms();
        }
    }
}

/* One turn of the keeper's loop: wait up to `ms` for something to do, do it. */
static void turn(struct keeper *k, int ms) {
    struct pollfd p[6];
    int n = 0, i_out = -1, i_err = -1, i_fifo = -1, i_ctl = -1, i_in = -1;
    if (k->out_fd >= 0) { i_out = n; p[n++] = (struct pollfd){k->out_fd, POLLIN, 0}; }
    if (k->err_fd >= 0) { i_err = n; p[n++] = (struct pollfd){k->err_fd, POLLIN, 0}; }
    if (k->pending_len + 2 * FRAME_MAX <= PENDING_MAX) {
        i_fifo = n;
        p[n++] = (struct pollfd){k->fifo, POLLIN, 0};
    }
    i_ctl = n;
    p[n++] = (struct pollfd){k->ctl, POLLIN, 0};
    if (k->in_fd >= 0 && k->pending_len > 0) { i_in = n; p[n++] = (struct pollfd){k->in_fd, POLLOUT, 0}; }
    p[n++] = (struct pollfd){sig_pipe[0], POLLIN, 0};
    int64_t now = mono_ms();
    if (k->deadline && !k->timed_out && k->deadline - now < ms) ms = (int)(k->deadline - now);
    if (k->kill_at && k->kill_at - now < ms) ms = (int)(k->kill_at - now);
    if (poll(p, (nfds_t)n, ms < 0 ? 0 : ms) < 0 && errno != EINTR) die(1, "poll");
    if (i_out >= 0 && p[i_out].revents) drain(k, &k->out_fd, &k->out);
    if (i_err >= 0 && p[i_err].revents) drain(k, &k->err_fd, &k->err);
    if (i_fifo >= 0 && p[i_fifo].revents & POLLIN) {
        ssize_t got = read(k->fifo, k->frame + k->frame_len, sizeof k->frame - k->frame_len);
        if (got > 0) {
            k->frame_len += (size_t)got;
            take_frames(k);
        }
    }
    if (p[i_ctl].revents & POLLIN) {
        char c[16];
        ssize_t got = read(k->ctl, c, sizeof c);
        for (ssize_t j = 0; j < got; j++) {
            if (c[j] != 'T' && c[j] != 'K') continue;
            k->killed = 1;
            ask_kill(k, c[j] == 'T' ? SIGTERM : SIGKILL);
        }
    }
    if (i_in >= 0 && p[i_in].revents) {
        ssize_t w = write(k->in_fd, k->pending, k->pending_len);
        if (w > 0) {
            memmove(k->pending, k->pending + w, k->pending_len - (size_t)w);
            k->pending_len -= (size_t)w;
        } else if (w < 0 && errno != EAGAIN && errno != EINTR) {
            close_stdin(k); /* the command closed its stdin */
        }
    }
    if (k->eof_asked && k->pending_len == 0 && k->in_fd >= 0) close_stdin(k);
    if (p[n - 1].revents & POLLIN) {
        char c[64];
        (void)!read(sig_pipe[0], c, sizeof c);
    }
    reap(k);
    now = mono_ms();
    if (k->deadline && !k->timed_out && now >= k->deadline) {
        k->timed_out = 1;
        ask_kill(k, SIGTERM);
    }
    if (k->kill_at && now >= k->kill_at) {
        signal_group(k, SIGKILL);
        k->kill_at = 0;
    }
}

/* -- ended execs' folders: a guest keeps KEEP_ENDED of them, and more for a while -- */

#define KEEP_ENDED 1024         /* ended execs whose folders stay, whatever their age */
#define PRUNE_AFTER_MS 120000   /* an older one goes once ended this long ago: Rift's
                                 * sweep (60 s) has recorded its end, and a read of it
                                 * answers that record (without the output) */
#define PRUNE_EVERY_MS 10000    /* the folders are looked over at most this often */

struct ended { int64_t at; char name[NAME_MAX + 1]; };

static int by_end(const void *a, const void *b) {
    int64_t x = ((const struct ended *)a)->at, y = ((const struct ended *)b)->at;
    return (x > y) - (x < y);
}

static void remove_folder(int parent, const char *name) {
    int fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return;
    DIR *d = fdopendir(fd);
    if (!d) { close(fd); return; }
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            unlinkat(fd, e->d_name, 0);
    closedir(d);
    unlinkat(parent, name, AT_REMOVEDIR);
}

static int64_t mtime_ms(const struct stat *st) {
    return (int64_t)st->st_mtim.tv_sec * 1000 + st->st_mtim.tv_nsec / 1000000;
}

/* KEEP_ENDED folders or fewer in `parent` (a folder's links: 2 and one a subfolder) */
static int few_folders(int parent) {
    struct stat st;
    return fstat(parent, &st) != 0 || st.st_nlink < 2 + KEEP_ENDED;
}

/* `parent`/.pruned says they were looked over less than PRUNE_EVERY_MS ago */
static int looked_over_lately(int parent, int64_t now) {
    struct stat st;
    return fstatat(parent, ".pruned", &st, AT_SYMLINK_NOFOLLOW) == 0 &&
           now - mtime_ms(&st) < PRUNE_EVERY_MS;
}

/* Each exec's folder (its output rings, status, fifos: seven inodes) would else
 * stay until the VM ends, and a guest ran out of inodes after some thousands of
 * execs (a 256 MiB `tiny`'s root at the 3,732nd): once its folders are past
 * KEEP_ENDED ended ones, the oldest ended PRUNE_AFTER_MS ago or more go. Run by
 * a keeper after its own exec's status is written, and by a start that found no
 * room for its folder (`room_needed`: then every one ended that long ago goes);
 * a running exec's folder (no status) is never touched. */
static void prune_ended(int room_needed) {
    char parent[PATH_MAX];
    snprintf(parent, sizeof parent, "%s", dir);
    char *slash = strrchr(parent, '/');
    if (!slash || slash == parent) return;
    *slash = 0;
    int pfd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (pfd < 0) return;
    int64_t now = now_ms();
    size_t keep = room_needed ? 0 : KEEP_ENDED;
    if (!room_needed && (few_folders(pfd) || looked_over_lately(pfd, now))) {
        close(pfd);
        return;
    }
    int marked = openat(pfd, ".pruned", O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (marked >= 0) {
        futimens(marked, NULL);
        close(marked);
    }
    struct stat st;
    DIR *d = fdopendir(pfd);
    if (!d) { close(pfd); return; }
    size_t n = 0, cap = 0;
    struct ended *all = NULL;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char status[NAME_MAX + 16];
        snprintf(status, sizeof status, "%s/status", e->d_name);
        if (fstatat(pfd, status, &st, AT_SYMLINK_NOFOLLOW) != 0) continue; /* running */
        if (n == cap) {
            cap = cap ? cap * 2 : 1024;
            struct ended *more = realloc(all, cap * sizeof *all);
            if (!more) break;
            all = more;
        }
        all[n].at = mtime_ms(&st);
        snprintf(all[n].name, sizeof all[n].name, "%s", e->d_name);
        n++;
    }
    if (n > keep) {
        qsort(all, n, sizeof *all, by_end);
        for (size_t i = 0; i < n - keep && all[i].at <= now - PRUNE_AFTER_MS; i++)
            remove_folder(pfd, all[i].name);
    }
    free(all);
    closedir(d); /* and pfd with it */
}

static int group_alive(pid_t pgid) { return kill(-pgid, 0) == 0 || errno == EPERM; }

static void finish(struct keeper *k) {
    int64_t until = mono_ms() + DRAIN_MS;
    while ((k->out_fd >= 0 || k->err_fd >= 0) && mono_ms() < until) turn(k, POLL_MS);
    if (k->killed || k->timed_out) { /* a kill leaves no process of its group */
        while (group_alive(k->child) && k->kill_at && mono_ms() < k->kill_at) turn(k, 50);
        signal_group(k, SIGKILL);
    }
    char text[128];
    int code = WIFEXITED(k->status) ? WEXITSTATUS(k->status) : -1;
    int sig = WIFSIGNALED(k->status) ? WTERMSIG(k->status) : -1;
    snprintf(text, sizeof text, "%d %d %d %d %lld\n", code, sig, k->timed_out, k->killed,
             (long long)k->ended);
    write_text_atomic("status", text);
    prune_ended(0);
}

static void nonblock(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

/* The keeper (a child of `start`, in a session of its own): starts the command,
 * keeps its output, stdin, timeout and kills until it ends, writes the status. */
static void keep(struct keeper *k, const char *command, int timeout_s) {
    setsid();
    int null = open("/dev/null", O_RDWR);
    dup2(null, 0);
    dup2(null, 1);
    dup2(null, 2);
    /* O_RDWR: the keeper holds both ends, so it never sees EOF nor blocks. */
    k->fifo = open(at("stdin"), O_RDWR | O_NONBLOCK | O_CLOEXEC);
    k->ctl = open(at("ctl"), O_RDWR | O_NONBLOCK | O_CLOEXEC);
    int out[2], err[2], in[2];
    if (k->fifo < 0 || k->ctl < 0 || pipe2(out, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0 ||
        pipe2(in, O_CLOEXEC) < 0 || pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) < 0)
        _exit(1);
    struct sigaction sa = {0};
    sa.sa_handler = on_child;
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigaction(SIGCHLD, &sa, NULL);
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    int64_t started = now_ms();
    k->child = fork();
    if (k->child < 0) _exit(1);
    if (k->child == 0) {
        setsid(); /* its own session and process group, whose id is its pid */
        signal(SIGHUP, SIG_DFL);
        signal(SIGPIPE, SIG_DFL);
        dup2(in[0], 0);
        dup2(out[1], 1);
        dup2(err[1], 2);
        const char *shell = getenv("SHELL"); /* the login shell, as sshd would run it */
        if (!shell || shell[0] != '/' || access(shell, X_OK) != 0) shell = "/bin/sh";
        execl(shell, shell, "-c", command, (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    close(err[1]);
    k->out_fd = out[0];
    k->err_fd = err[0];
    k->in_fd = in[1];
    nonblock(k->out_fd);
    nonblock(k->err_fd);
    nonblock(k->in_fd);
    char text[128];
    snprintf(text, sizeof text, "%ld %ld %lld\n", (long)getpid(), (long)k->child,
             (long long)started);
    write_text_atomic("pid", text);
    if (k->ready_fd >= 0) {
        (void)!write(k->ready_fd, "1", 1);
        close(k->ready_fd);
        k->ready_fd = -1;
    }
    if (timeout_s > 0) k->deadline = mono_ms() + (int64_t)timeout_s * 1000;
    while (!k->exited) turn(k, 1000);
    finish(k);
}

static int cmd_start(int argc, char **argv) {
    if (argc < 8) return 2;
    int timeout_s = atoi(argv[3]);
    uint64_t cap = strtoull(argv[4], NULL, 10);
    int64_t wait_ms = atoll(argv[5]);
    size_t max = (size_t)strtoull(argv[6], NULL, 10);
    int with_stdin = 0, i = 7;
    long long clock_cs = 0;
    if (strncmp(argv[i], "--clock=", 8) == 0) {
        char *end;
        clock_cs = strtoll(argv[i] + 8, &end, 10);
        if (*end || clock_cs <= 0) return 2;
        i++;
    }
    if (i < argc && strcmp(argv[i], "--stdin") == 0) { with_stdin = 1; i++; }
    if (i + 1 >= argc || strcmp(argv[i], "--") != 0 || cap == 0) return 2;
    const char *command = argv[i + 1];
    if (clock_cs > 0) { /* as `date -s` did: a guest that refuses keeps its clock */
        struct timespec ts = {clock_cs / 100, (long)(clock_cs % 100) * 10000000};
        (void)clock_settime(CLOCK_REALTIME, &ts);
    }

    signal(SIGHUP, SIG_IGN); /* the SSH channel may go: the keeper stays */
    signal(SIGPIPE, SIG_IGN);
    static struct keeper k;
    memset(&k, 0, sizeof k);
    k.pending = malloc(PENDING_MAX);
    if (!k.pending) die(1, "out of memory");
    if (with_stdin) { /* read to its end: the command gets it, then EOF */
        for (;;) {
            if (k.pending_len == PENDING_MAX) die(1, "stdin larger than 16 MiB");
            ssize_t n = read(0, k.pending + k.pending_len, PENDING_MAX - k.pending_len);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) break;
            k.pending_len += (size_t)n;
        }
        k.eof_asked = 1;
    }
    char *parent = strdup(dir), *slash = strrchr(parent, '/');
    if (slash && slash != parent) {
        *slash = 0;
        mkdir(parent, 0700); /* DIR's parent; exists already but for the first exec */
    }
    if (mkdir(dir, 0700) < 0 && !(errno == ENOSPC && (prune_ended(1), mkdir(dir, 0700) == 0)))
        die(1, dir);
    ring_make(&k.out, "out", cap);
    ring_make(&k.err, "err", cap);
    if (mkfifo(at("stdin"), 0600) < 0 || mkfifo(at("ctl"), 0600) < 0) die(1, "mkfifo");
    int ready[2];
    if (pipe2(ready, O_CLOEXEC) < 0) die(1, "pipe");
    fflush(stdout);
    pid_t keeper = fork();
    if (keeper < 0) die(1, "fork");
    if (keeper == 0) {
        close(ready[0]);
        k.ready_fd = ready[1];
        keep(&k, command, timeout_s);
        _exit(0);
    }
    close(ready[1]);
    /* The caller's half: once the keeper is under way (its byte on the pipe, no
     * polling that would take a starved guest's CPU from it), wait for the end or
     * WAIT_MS, answer, and exit, so the SSH channel gets its exit status like any
     * other. A keeper not under way within 10 s is killed, so that no command the
     * call was told failed starts after. */
    struct pollfd started = {.fd = ready[0], .events = POLLIN};
    int polled;
    do polled = poll(&started, 1, 10000); while (polled < 0 && errno == EINTR);
    char byte;
    if (polled <= 0 || read(ready[0], &byte, 1) != 1) {
        kill(-keeper, SIGKILL);
        kill(keeper, SIGKILL);
        waitpid(keeper, NULL, 0);
        errno = 0;
        die(1, "the keeper did not start");
    }
    close(ready[0]);
    int64_t deadline = mono_ms() + wait_ms;
    for (;;) {
        struct facts f;
        read_facts(&f);
        if (f.ended || f.lost) break;
        int64_t left = deadline - mono_ms();
        if (left <= 0) break;
        sleep_ms(left < POLL_MS ? (int)left : POLL_MS);
    }
    print_view(0, 0, max);
    return 0;
}

static int cmd_read(int argc, char **argv) {
    if (argc != 7) return 2;
    uint64_t out_off = strtoull(argv[3], NULL, 10), err_off = strtoull(argv[4], NULL, 10);
    wait_for(out_off, err_off, atoll(argv[6]));
    print_view(out_off, err_off, (size_t)strtoull(argv[5], NULL, 10));
    return 0;
}

static int cmd_input(int argc, char **argv) {
    int eof = argc == 4 && strcmp(argv[3], "--eof") == 0;
    if (argc != 3 && !eof) return 2;
    signal(SIGPIPE, SIG_IGN); /* a keeper that ended meanwhile: EPIPE, not death */
    struct facts f;
    read_facts(&f);
    if (f.ended || f.lost) return 4;
    if (!f.stdin_open) return 5;
    int fd = open(at("stdin"), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return errno == ENXIO ? 4 : 1;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    char frame[FRAME_MAX];
    unsigned long long total = 0;
    for (;;) {
        ssize_t n = read(0, frame + 2, FRAME_MAX - 2);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        frame[0] = (char)(n & 0xff);
        frame[1] = (char)(n >> 8);
        if (write_all(fd, frame, (size_t)n + 2) < 0) return 4;
        total += (unsigned long long)n;
    }
    if (eof) { /* the keeper may be gone by now: its command read all and ended */
        frame[0] = frame[1] = 0;
        write_all(fd, frame, 2);
    }
    printf("rift-exec input=%llu\n", total);
    return 0;
}

static int cmd_kill(int argc, char **argv) {
    if (argc != 4 || (strcmp(argv[3], "TERM") != 0 && strcmp(argv[3], "KILL") != 0)) return 2;
    struct facts f;
    read_facts(&f);
    if (f.ended) return 0; /* a repeat, or too late: nothing changes */
    char c = argv[3][0];
    int fd = open(at("ctl"), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0 && write(fd, &c, 1) == 1) {
        close(fd);
        return 0;
    }
    /* No keeper to ask: signal the group directly. */
    char text[256];
    long long keeper = 0, child = 0;
    if (read_text(at("pid"), text, sizeof text) == 0 &&
        sscanf(text, "%lld %lld", &keeper, &child) == 2 && child > 0)
        kill(-(pid_t)child, c == 'T' ? SIGTERM : SIGKILL);
    return 0;
}

/* identity: its steps, each exiting 10 + its number with the reason when it fails. */
enum { ID_INPUT = 1, ID_KEY, ID_MAC, ID_ENTROPY, ID_CLOCK, ID_RESTART };

static void id_fail(int step, const char *what) {
    fprintf(stderr, "rift-exec identity: %s: %s\n", what, errno ? strerror(errno) : "failed");
    exit(10 + step);
}

static void id_write_file(const char *path, const char *data, size_t len, mode_t mode) {
    char aside[PATH_MAX];
    snprintf(aside, sizeof aside, "%s.new", path);
    unlink(aside);
    int fd = open(aside, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0 || write_all(fd, data, len) < 0 || close(fd) < 0) id_fail(ID_KEY, aside);
    if (rename(aside, path) < 0) id_fail(ID_KEY, path);
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int not_dot_or_lo(const struct dirent *e) {
    return e->d_name[0] != '.' && strcmp(e->d_name, "lo") != 0;
}

static void id_mac(const char *mac) {
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    unsigned char *hw = (unsigned char *)ifr.ifr_hwaddr.sa_data;
    for (int i = 0; i < 6; i++) {
        int hi = hex_digit(mac[3 * i]), lo = hex_digit(mac[3 * i + 1]);
        char sep = mac[3 * i + 2];
        if (hi < 0 || lo < 0 || sep != (i == 5 ? '\0' : ':')) {
            errno = EINVAL;
            id_fail(ID_MAC, "MAC");
        }
        hw[i] = (unsigned char)(hi << 4 | lo);
    }
    struct dirent **names;
    int n = scandir("/sys/class/net", &names, not_dot_or_lo, alphasort);
    if (n <= 0) {
        if (n == 0) errno = ENODEV;
        id_fail(ID_MAC, "/sys/class/net");
    }
    size_t name_len = strlen(names[0]->d_name);
    if (name_len >= IFNAMSIZ) {
        errno = ENAMETOOLONG;
        id_fail(ID_MAC, names[0]->d_name);
    }
    memcpy(ifr.ifr_name, names[0]->d_name, name_len + 1);
    ifr.ifr_hwaddr.sa_family = ARPHRD_ETHER;
    int sock = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (sock < 0 || ioctl(sock, SIOCSIFHWADDR, &ifr) < 0) id_fail(ID_MAC, ifr.ifr_name);
    close(sock);
}

static void id_entropy(const char *hex) {
    unsigned char bytes[256];
    size_t n = 0;
    for (; hex[2 * n] && hex[2 * n + 1] && n < sizeof bytes; n++) {
        int hi = hex_digit(hex[2 * n]), lo = hex_digit(hex[2 * n + 1]);
        if (hi < 0 || lo < 0) break;
        bytes[n] = (unsigned char)(hi << 4 | lo);
    }
    if (n < 16) {
        errno = EINVAL;
        id_fail(ID_ENTROPY, "fewer than 16 bytes of entropy");
    }
    int fd = open("/dev/urandom", O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write_all(fd, bytes, n) < 0) id_fail(ID_ENTROPY, "/dev/urandom");
    if (ioctl(fd, RNDRESEEDCRNG) != 0) id_fail(ID_ENTROPY, "RNDRESEEDCRNG");
    close(fd);
}

static pid_t id_pid(const char *pidfile) {
    if (strcmp(pidfile, "-") == 0) return 0;
    FILE *f = fopen(pidfile, "re");
    long pid = 0;
    if (f) {
        if (fscanf(f, "%ld", &pid) != 1) pid = 0;
        fclose(f);
    }
    return pid > 1 ? (pid_t)pid : 0;
}

/* In a session of its own, its stdio on /dev/null (so the SSH channel ends now):
 * SETTLE_MS later, the SSH server starts anew. */
static void id_restart(int settle_ms, const char *pidfile, char **restart) {
    pid_t child = fork();
    if (child < 0) id_fail(ID_RESTART, "fork");
    if (child > 0) return;
    setsid();
    int null = open("/dev/null", O_RDWR);
    if (null >= 0) {
        dup2(null, 0);
        dup2(null, 1);
        dup2(null, 2);
        if (null > 2) close(null);
    }
    sleep_ms(settle_ms);
    pid_t old = id_pid(pidfile);
    if (!restart[0]) {
        if (old) kill(old, SIGHUP);
        _exit(0);
    }
    if (old) {
        kill(old, SIGTERM);
        for (int i = 0; i < 500 && kill(old, 0) == 0; i++) sleep_ms(10);
    }
    execvp(restart[0], restart);
    _exit(127);
}

static int cmd_identity(int argc, char **argv) {
    if (argc < 8 || (argc > 8 && strcmp(argv[8], "--") != 0)) return 2;
    const char *mac = argv[3], *key = argv[6], *pidfile = argv[7];
    char *end;
    long long now_cs = strtoll(argv[4], &end, 10);
    if (*end || now_cs <= 0) return 2;
    int settle_ms = atoi(argv[5]);
    int64_t began = mono_ms();
    static char input[64 * 1024];
    size_t len = 0;
    for (;;) {
        if (len == sizeof input - 1) {
            errno = EFBIG;
            id_fail(ID_INPUT, "stdin");
        }
        ssize_t n = read(0, input + len, sizeof input - 1 - len);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) id_fail(ID_INPUT, "stdin");
        if (n == 0) break;
        len += (size_t)n;
    }
    input[len] = 0;
    char *pub = strchr(input, '\n');
    char *private = pub ? strchr(pub + 1, '\n') : NULL;
    if (!private) {
        errno = EINVAL;
        id_fail(ID_INPUT, "stdin: the entropy line and the public key line");
    }
    *pub++ = 0;
    *private++ = 0;
    if (*pub) {
        char path[PATH_MAX], line[1024];
        id_write_file(key, private, strlen(private), 0600);
        snprintf(path, sizeof path, "%s.pub", key);
        int n = snprintf(line, sizeof line, "%s root@rift\n", pub);
        if (n < 0 || (size_t)n >= sizeof line) {
            errno = EINVAL;
            id_fail(ID_KEY, "the public key line is too long");
        }
        id_write_file(path, line, (size_t)n, 0644);
    }
    if (strcmp(mac, "-") != 0) id_mac(mac);
    id_entropy(input);
    int64_t at_ms = now_cs * 10 + (mono_ms() - began);
    struct timespec ts = {at_ms / 1000, (long)(at_ms % 1000) * 1000000};
    if (clock_settime(CLOCK_REALTIME, &ts) < 0) id_fail(ID_CLOCK, "clock_settime");
    id_restart(settle_ms, pidfile, argc > 9 ? argv + 9 : argv + argc);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: rift-exec start|read|input|kill|identity DIR ...\n");
        return 2;
    }
    dir = argv[2];
    int code = 2;
    if (strcmp(argv[1], "start") == 0) code = cmd_start(argc, argv);
    else if (strcmp(argv[1], "read") == 0) code = cmd_read(argc, argv);
    else if (strcmp(argv[1], "input") == 0) code = cmd_input(argc, argv);
    else if (strcmp(argv[1], "kill") == 0) code = cmd_kill(argc, argv);
    else if (strcmp(argv[1], "identity") == 0) code = cmd_identity(argc, argv);
    if (code == 2) fprintf(stderr, "rift-exec: bad arguments\n");
    fflush(stdout);
    return code;
}
