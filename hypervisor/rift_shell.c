/*
 * rift-shell: root's login shell in Rift's `debian` image (and the images made
 * from it), so that an exec starts one bash, not two.
 *
 * sshd runs each session's command as `SHELL -c LINE`. Every exec Rift starts
 * or reads is the line `exec /usr/lib/rift/rift-exec WORD...`
 * (rift/guest/exec_view.py), which needs no shell; under TCG a bash takes
 * 45-55 ms to start in a `debian` guest, this program 5 ms. So when LINE is
 * exactly that, each word made of bare characters (those Python's shlex.quote
 * leaves bare: letters, digits and @%+=:,./_-) and of quotes as shlex.quote
 * writes them ('...' and "'"), one space between words, rift-shell runs the
 * helper itself with those words, as bash would have. Anything else (any other
 * line, any other character outside quotes, a login with no command, su,
 * sudo -i) goes to /bin/bash with the same arguments, as if bash were the
 * shell. Either way SHELL is /bin/bash, so what the session starts sees bash
 * as root's shell.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef BASH /* (tests compile it with others) */
#define BASH "/bin/bash"
#endif
#ifndef HELPER /* the helper's path: the build passes hypervisor/exec_helper.py's GUEST_PATH */
#error "build with -DHELPER='\"/path/of/rift-exec\"'"
#endif
#define PREFIX "exec " HELPER " "
#define MAX_WORDS 64

static int bare(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (c != '\0' && strchr("@%+=:,./_-", c) != NULL);
}

/* Split `s` into `words` in place (no word is longer than its quoted form); answer
   their number, or -1 when `s` is anything but such words one space apart. */
static int split(char *s, char **words) {
    char *out = s;
    int n = 0;
    for (;;) {
        if (n == MAX_WORDS || *s == ' ' || *s == '\0') return -1; /* no word here */
        words[n++] = out;
        while (*s != ' ' && *s != '\0') {
            if (*s == '\'') {
                char *end = strchr(s + 1, '\'');
                if (end == NULL) return -1;
                size_t len = (size_t)(end - s - 1);
                memmove(out, s + 1, len);
                out += len;
                s = end + 1;
            } else if (s[0] == '"' && s[1] == '\'' && s[2] == '"') {
                *out++ = '\'';
                s += 3;
            } else if (bare(*s)) {
                *out++ = *s++;
            } else {
                return -1;
            }
        }
        char sep = *s; /* read before the word's end is written: `out` may be `s` */
        *out++ = '\0';
        if (sep == '\0') return n;
        s++;
    }
}

int main(int argc, char **argv) {
    setenv("SHELL", BASH, 1);
    if (argc == 3 && strcmp(argv[1], "-c") == 0 &&
        strncmp(argv[2], PREFIX, strlen(PREFIX)) == 0) {
        char *words[MAX_WORDS + 2];
        char *line = strdup(argv[2] + strlen(PREFIX)); /* split in place; bash gets argv[2] */
        words[0] = HELPER;
        int n = line == NULL ? -1 : split(line, words + 1);
        if (n > 0) {
            words[n + 1] = NULL;
            execv(HELPER, words);
            perror("rift-shell: " HELPER);
            return 127;
        }
    }
    argv[0] = argv[0][0] == '-' ? "-bash" : "bash"; /* a login shell stays one */
    execv(BASH, argv);
    perror("rift-shell: " BASH);
    return 127;
}
