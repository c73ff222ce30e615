/*
 * fp_check: run kvx_config_fingerprint() over JSON texts read from stdin.
 *
 * Input framing (binary-safe, driven by check_corpus.py): for each case, the
 * decimal byte length of the text, '\n', the text bytes, '\n'. The text is
 * passed to the library as a C string (corpus texts contain no NUL byte).
 *
 * Output, one line per case, in order:
 *   "OK <fingerprint>"     (fingerprint may be empty: "OK ")
 *   "ERR <code> <message>" (newlines in the message replaced by spaces)
 * Exit status 0, or 2 on malformed input framing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvxfer.h"

static int read_case(char **text, size_t *len) {
    char line[64];
    if (!fgets(line, sizeof line, stdin)) return 0; /* end of input */
    char *end = NULL;
    unsigned long long n = strtoull(line, &end, 10);
    if (end == line || *end != '\n') return -1;
    char *buf = malloc((size_t)n + 1);
    if (!buf) return -1;
    if (fread(buf, 1, (size_t)n, stdin) != (size_t)n || fgetc(stdin) != '\n') {
        free(buf);
        return -1;
    }
    buf[n] = '\0';
    *text = buf;
    *len = (size_t)n;
    return 1;
}

int main(void) {
    for (;;) {
        char *text = NULL;
        size_t len = 0;
        int r = read_case(&text, &len);
        if (r == 0) break;
        if (r < 0) {
            fprintf(stderr, "fp_check: malformed input framing\n");
            return 2;
        }
        if (strlen(text) != len) {
            /* An embedded NUL cannot be passed through the C API. */
            printf("SKIP embedded NUL\n");
            free(text);
            continue;
        }
        char out[KVX_FINGERPRINT_LEN + 1];
        memset(out, 'X', sizeof out);
        int rc = kvx_config_fingerprint(out, text);
        if (rc == 0) {
            printf("OK %s\n", out);
        } else {
            const char *msg = kvx_last_error_message();
            printf("ERR %d ", rc);
            for (const char *p = msg ? msg : ""; *p; ++p) putchar(*p == '\n' || *p == '\r' ? ' ' : *p);
            putchar('\n');
        }
        free(text);
    }
    return fflush(stdout) == 0 ? 0 : 1;
}
