/*
 * gen-keys: writes ces2pg.conf(5) from its template and the key table of src/conf/config.c, so that
 * the page cannot drift from what ces2pg accepts.
 *
 *   gen-keys TEMPLATE OUTPUT
 *
 * The template is roff (man(7)) written by hand (CMake's configure_file has put the version in):
 * the meaning of each key, taken from conf/ces2pg.conf. A line "@KEY group.name@" stands for one
 * key: it becomes the key's tag and a line of facts from the table (type, range, default,
 * required, reloadable), and the prose that follows is its meaning. It fails, writing nothing,
 * when a key of the table has no @KEY line, a @KEY line names a key the table lacks or comes
 * twice, or any other '@' is left over.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf/config.h"

/* Text for roff: backslashes and hyphens escaped (so that names and values copy as typed). */
static void put_escaped(FILE *out, const char *s) {
    for (; *s != '\0'; s++) {
        if (*s == '\\')
            fputs("\\e", out);
        else if (*s == '-')
            fputs("\\-", out);
        else
            fputc(*s, out);
    }
}

/* Bounds as conf/ces2pg.conf writes them: large powers of two as 2^N. */
static void put_bound(FILE *out, int64_t v) {
    if (v >= (INT64_C(1) << 30) && (v & (v - 1)) == 0) {
        int n = 0;
        while ((INT64_C(1) << n) != v)
            n++;
        fprintf(out, "2^%d", n);
    } else {
        fprintf(out, "%" PRId64, v);
    }
}

static void put_facts(FILE *out, const ces_config_key_info_t *k) {
    fputs(".TP\n.B ", out);
    put_escaped(out, k->name);
    fputs("\n(", out);
    fputs(k->type, out);
    if (k->has_range) {
        fputs(", ", out);
        put_bound(out, k->min);
        fputs("..", out);
        put_bound(out, k->max);
    }
    fputs("; ", out);
    if (k->required_for_daemon && k->required_for_replay)
        fputs("required", out);
    else if (k->required_for_daemon)
        fputs("required by the daemon", out);
    else if (k->default_value == NULL)
        fputs(strcmp(k->type, "list of strings") == 0 ? "default [ ]" : "unset by default", out);
    else if (strcmp(k->type, "string") == 0) {
        fputs("default \"", out);
        put_escaped(out, k->default_value);
        fputs("\"", out);
    } else {
        fputs("default ", out);
        put_escaped(out, k->default_value);
    }
    fputs(k->reloadable ? "; reload" : "; restart", out);
    fputs(")\n.br\n", out);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: gen-keys TEMPLATE OUTPUT\n");
        return 64;
    }
    const char *template_path = argv[1], *output_path = argv[2];
    FILE *in = fopen(template_path, "r");
    if (in == NULL) {
        perror(template_path);
        return 1;
    }
    size_t nkeys = ces_config_key_count();
    int *seen = calloc(nkeys, sizeof(*seen));
    char *text = NULL;
    size_t text_len = 0;
    FILE *out = open_memstream(&text, &text_len);
    if (seen == NULL || out == NULL) {
        fprintf(stderr, "gen-keys: out of memory\n");
        return 1;
    }
    bool ok = true;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int lineno = 0;
    while ((len = getline(&line, &cap, in)) != -1) {
        lineno++;
        if (len > 0 && line[len - 1] == '\n')
            line[--len] = '\0';
        char name[128];
        if (strncmp(line, "@KEY ", 5) == 0 && len > 6 && line[len - 1] == '@' &&
            (size_t)len - 6 < sizeof(name)) {
            snprintf(name, sizeof(name), "%.*s", (int)(len - 6), line + 5);
            size_t i = 0;
            ces_config_key_info_t info;
            while (ces_config_key_info(i, &info) && strcmp(info.name, name) != 0)
                i++;
            if (i == nkeys) {
                fprintf(stderr, "%s:%d: %s is not a key of src/conf/config.c's table\n", template_path,
                        lineno, name);
                ok = false;
                continue;
            }
            if (seen[i] != 0) {
                fprintf(stderr, "%s:%d: %s is described twice (first on line %d)\n",
                        template_path, lineno, name, seen[i]);
                ok = false;
            }
            seen[i] = lineno;
            put_facts(out, &info);
            continue;
        }
        fputs(line, out);
        fputc('\n', out);
        if (strchr(line, '@') != NULL) {
            fprintf(stderr, "%s:%d: a marker gen-keys does not know: %s\n", template_path, lineno,
                    line);
            ok = false;
        }
    }
    free(line);
    fclose(in);
    fclose(out);
    for (size_t i = 0; i < nkeys; i++) {
        ces_config_key_info_t info;
        if (ces_config_key_info(i, &info) && seen[i] == 0) {
            fprintf(stderr, "%s: no @KEY %s@: every key of src/conf/config.c's table must be described\n",
                    template_path, info.name);
            ok = false;
        }
    }
    free(seen);
    if (ok) {
        FILE *f = fopen(output_path, "w");
        if (f == NULL || fwrite(text, 1, text_len, f) != text_len || fclose(f) != 0) {
            perror(output_path);
            ok = false;
        }
    }
    free(text);
    return ok ? 0 : 1;
}
