/*
 * rift-pty: a terminal for a Rift exec (SPEC §16's PTYs). A static binary that
 * Rift uploads to a guest on its first terminal (hypervisor/pty_helper.py says
 * where), run by rift-exec (rift_exec.c) as the exec's command, so a terminal
 * is an exec like any other: its output in the exec's stdout ring, its input
 * the exec's stdin, a kill of the exec a hangup of the terminal.
 *
 *   rift-pty run ROWS COLS TTYFILE -- COMMAND
 *       Open a pseudo-terminal of ROWS x COLS, write its name to TTYFILE, and
 *       run `$SHELL -c COMMAND` (else /bin/sh) on it, in a session of its own
 *       whose controlling terminal it is. Copy this stdin to the terminal and
 *       the terminal's output to this stdout until the command ended and the
 *       terminal said all (at most DRAIN_MS more while another process holds
 *       it open). Exit with the command's status (128 + the signal that ended
 *       it). A TERM, INT or HUP to rift-pty hangs the command up (HUP, then
 *       CONT, to its process group), as a terminal that closes does.
 *   rift-pty resize TTYFILE ROWS COLS
 *       Give the terminal TTYFILE names ROWS x COLS (its foreground process
 *       group gets SIGWINCH).
 *
 * Exit status: the command's (run), 0 (resize), 2 usage, 3 no such terminal,
 * 1 other failure. The sizes are checked by Rift (1..MAX_SIDE each) and again
 * here.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#define MAX_SIDE 1000
#define DRAIN_MS 200
#define PENDING_MAX 65536
#define TTY_MAX 64

static int sig_pipe[2];

static int usage(void) {
    fprintf(stderr, "usage: rift-pty run ROWS COLS TTYFILE -- COMMAND | "
                    "resize TTYFILE ROWS COLS\n");
    return 2;
}
static volatile sig_atomic_t hangup_asked;

static void on_signal(int sig) {
    int saved = errno;
    if (sig != SIGCHLD) hangup_asked = 1;
    (void)!write(sig_pipe[1], "s", 1);
    errno = saved;
}

static long mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int write_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int side(const char *text) {
    char *end;
    long n = strtol(text, &end, 10);
    return (*text && !*end && n >= 1 && n <= MAX_SIDE) ? (int)n : -1;
}

static void set_size(int fd, int rows, int cols, const char *what) {
    struct winsize ws = {0};
    ws.ws_row = (unsigned short)rows;
    ws.ws_col = (unsigned short)cols;
    if (ioctl(fd, TIOCSWINSZ, &ws) < 0) {
        fprintf(stderr, "rift-pty: %s: %s\n", what, strerror(errno));
        exit(1);
    }
}

static void write_name(const char *path, const char *name) {
    char aside[4096];
    snprintf(aside, sizeof aside, "%s.new", path);
    int fd = open(aside, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || write_all(fd, name, strlen(name)) < 0 || close(fd) < 0 ||
        rename(aside, path) < 0) {
        fprintf(stderr, "rift-pty: %s: %s\n", path, strerror(errno));
        exit(1);
    }
}

static void child(const char *name, const char *command) {
    setsid();
    int slave = open(name, O_RDWR); /* a session leader's first terminal: its own */
    if (slave < 0) _exit(127);
    ioctl(slave, TIOCSCTTY, 0);
    dup2(slave, 0);
    dup2(slave, 1);
    dup2(slave, 2);
    if (slave > 2) close(slave);
    int sigs[] = {SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGPIPE, SIGCHLD, SIGTTOU, SIGTTIN};
    for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) signal(sigs[i], SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    const char *shell = getenv("SHELL");
    if (!shell || shell[0] != '/' || access(shell, X_OK) != 0) shell = "/bin/sh";
    execl(shell, shell, "-c", command, (char *)NULL);
    _exit(127);
}

static int cmd_run(int argc, char **argv) {
    if (argc != 7 || strcmp(argv[5], "--") != 0) return usage();
    int rows = side(argv[2]), cols = side(argv[3]);
    if (rows < 0 || cols < 0) return usage();
    int master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (master < 0 || grantpt(master) < 0 || unlockpt(master) < 0) {
        perror("rift-pty: posix_openpt");
        return 1;
    }
    const char *name = ptsname(master);
    if (!name || strlen(name) >= TTY_MAX) return 1;
    char tty[TTY_MAX];
    strcpy(tty, name);
    set_size(master, rows, cols, "TIOCSWINSZ");
    if (pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) < 0) return 1;
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    int caught[] = {SIGCHLD, SIGTERM, SIGINT, SIGHUP};
    for (size_t i = 0; i < sizeof caught / sizeof *caught; i++) sigaction(caught[i], &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid == 0) child(tty, argv[6]);
    write_name(argv[4], tty); /* once a signal can reach the shell: handlers set, child made */
    fcntl(master, F_SETFL, fcntl(master, F_GETFL) | O_NONBLOCK);
    static char pending[PENDING_MAX], buf[65536];
    size_t pending_len = 0;
    int in_open = 1, term_open = 1, status = 0, exited = 0, hanging_up = 0;
    long drain_until = 0;
    while (term_open && !(exited && mono_ms() >= drain_until)) {
        struct pollfd p[3];
        int n = 0, i_in = -1;
        short want = POLLIN | (pending_len ? POLLOUT : 0);
        p[n++] = (struct pollfd){master, want, 0};
        p[n++] = (struct pollfd){sig_pipe[0], POLLIN, 0};
        if (in_open && pending_len < PENDING_MAX) {
            i_in = n;
            p[n++] = (struct pollfd){0, POLLIN, 0};
        }
        int wait = exited ? (int)(drain_until - mono_ms()) : 1000;
        if (poll(p, (nfds_t)n, wait < 0 ? 0 : wait) < 0 && errno != EINTR) return 1;
        if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
            ssize_t got = read(master, buf, sizeof buf);
            if (got > 0) {
                if (write_all(1, buf, (size_t)got) < 0) term_open = 0;
            } else if (got == 0 || (errno != EAGAIN && errno != EINTR)) {
                term_open = 0; /* EIO: no process holds the terminal any more */
            }
        }
        if (term_open && pending_len && (p[0].revents & POLLOUT)) {
            ssize_t w = write(master, pending, pending_len);
            if (w > 0) {
                memmove(pending, pending + w, pending_len - (size_t)w);
                pending_len -= (size_t)w;
            }
        }
        if (i_in >= 0 && p[i_in].revents) {
            ssize_t got = read(0, pending + pending_len, PENDING_MAX - pending_len);
            if (got > 0) pending_len += (size_t)got;
            else if (got == 0 || (errno != EAGAIN && errno != EINTR)) in_open = 0;
        }
        if (p[1].revents & POLLIN) {
            char c[64];
            (void)!read(sig_pipe[0], c, sizeof c);
        }
        if (hangup_asked) {
            hangup_asked = 0;
            hanging_up = 1;
        }
        if (hanging_up && !exited) {
            /* again each turn (at most a second apart) until the shell is gone: one asked
               before the child made its session (setsid) reaches no group, and one the
               child took before it reset its handlers is lost */
            if (kill(-pid, SIGHUP) < 0) kill(pid, SIGHUP);
            kill(-pid, SIGCONT);
        }
        if (!exited && waitpid(pid, &status, WNOHANG) == pid) {
            exited = 1;
            drain_until = mono_ms() + DRAIN_MS;
        }
    }
    if (!exited) waitpid(pid, &status, 0);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

static int cmd_resize(int argc, char **argv) {
    if (argc != 5) return usage();
    int rows = side(argv[3]), cols = side(argv[4]);
    if (rows < 0 || cols < 0) return usage();
    char name[TTY_MAX];
    int fd = open(argv[2], O_RDONLY | O_CLOEXEC);
    ssize_t got = fd < 0 ? -1 : read(fd, name, sizeof name - 1);
    if (fd >= 0) close(fd);
    if (got <= 0) return 3;
    name[got] = 0;
    if (strncmp(name, "/dev/pts/", 9) != 0) return 3;
    int tty = open(name, O_RDWR | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
    if (tty < 0) return 3;
    set_size(tty, rows, cols, name);
    close(tty);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "run") == 0) return cmd_run(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "resize") == 0) return cmd_resize(argc, argv);
    return usage();
}
