/*
 * SIMULATED nvidia-smi, the fast path: a TEST DOUBLE installed as ~/bin/nvidia-smi on deployctl sandbox
 * hosts (sandbox/hosts.py compiles it once per sandbox, beside sim_network.c).
 *
 * It answers the two queries deployctl sends (--query-gpu=FIELDS and --query-compute-apps=FIELDS with
 * --format=csv[,noheader][,nounits]) exactly as sandbox/sim_nvidia_smi.py does, byte for byte, from the
 * same state: GPU device files held open by real processes (/proc/<pid>/fd), ~/.sim/alloc/<pid>.<gpu>
 * MiB files, the host's config.json. Everything else, and every state it does not read the plain way
 * (a knob file present: driver_failed, query_delay_s, phantom.json; a config, alloc file, process name
 * or output that is not plain ASCII; a -i, -L, -h or table request; a field or format the real tool
 * refuses), it hands to the Python stand-in by exec, which remains the one model of the real tool
 * (tests/unit/test_sim_nvidia_smi_fast.py compares the two on generated states).
 *
 * Why: the suite's hosts call nvidia-smi about 1,500 times per run, and the Python stand-in took about
 * 12 ms of CPU per call (an interpreter start and a /proc scan); this takes about 3 ms, most of it the
 * exec. A real nvidia-smi is a C program too, so no host-side check (deployctl's python3 process selection) sees a
 * python3 process for a GPU query any more.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef FALLBACK_PYTHON
#define FALLBACK_PYTHON "/usr/bin/python3"
#endif
#define DEFAULT_CONTEXT_MIB 512
#define MAX_GPUS 64
#define MAX_APPS 4096
#define MAX_FIELDS 32

static char **original_argv;

/* Hand the call to the Python stand-in (same argv, same pid): never returns. Its launcher lies in the
 * host's ~/.sim/lib, beside this program's ~/bin (sandbox/hosts.py _build_home). */
static void fallback(void) {
    char self[PATH_MAX], script[PATH_MAX + 64];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    int argc = 0;
    while (original_argv[argc]) argc++;
    if (len <= 0) _exit(127);
    self[len] = 0;
    for (int up = 0; up < 2; up++) {
        char *slash = strrchr(self, '/');
        if (!slash || slash == self) _exit(127);
        *slash = 0;
    }
    snprintf(script, sizeof script, "%s/.sim/lib/sim_nvidia_smi_main.py", self);
    char **args = calloc((size_t)argc + 4, sizeof *args);
    if (!args) _exit(127);
    args[0] = FALLBACK_PYTHON; /* as the kernel starts a "#!/usr/bin/python3 -IS" script */
    args[1] = "-IS";
    args[2] = script;
    for (int i = 1; i < argc; i++) args[i + 2] = original_argv[i];
    execv(FALLBACK_PYTHON, args);
    _exit(127);
}

static int plain_ascii(const char *s) {
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e) return 0;
    return 1;
}

/* ---- a strict reader of the config's JSON (what json.load accepts; anything doubtful: fallback) ---- */

struct config {
    long gpu_count, gpu_total_mib;
    int has_count, has_total;
    char *gpu_dir, *gpu_name, *alloc_dir, *driver_failed_flag, *phantom_file;
    int phantom_null;
    char *uuids[MAX_GPUS], *bus_ids[MAX_GPUS];
    int n_uuids, n_bus_ids, uuids_default, bus_ids_default;
};

static const char *p;

static void ws(void) { while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++; }

/* A string without escapes (else fallback), returned as a new copy; p after the closing quote. */
static char *string_plain(void) {
    if (*p != '"') fallback();
    const char *start = ++p;
    while (*p && *p != '"') {
        if (*p == '\\' || (unsigned char)*p < 0x20) fallback();
        p++;
    }
    if (*p != '"') fallback();
    char *out = strndup(start, (size_t)(p - start));
    if (!out) fallback();
    p++;
    return out;
}

static void skip_value(int depth);

static void skip_string(void) {
    if (*p != '"') fallback();
    p++;
    while (*p && *p != '"') {
        if ((unsigned char)*p < 0x20) fallback();
        if (*p == '\\') {
            p++;
            if (*p == 'u') {
                for (int i = 1; i <= 4; i++)
                    if (!isxdigit((unsigned char)p[i])) fallback();
                p += 4;
            } else if (!strchr("\"\\/bfnrt", *p) || !*p) {
                fallback();
            }
        }
        p++;
    }
    if (*p != '"') fallback();
    p++;
}

static void skip_number(void) {
    if (*p == '-') p++;
    if (*p == '0') p++;
    else if (*p >= '1' && *p <= '9') while (isdigit((unsigned char)*p)) p++;
    else fallback();
    if (*p == '.') {
        p++;
        if (!isdigit((unsigned char)*p)) fallback();
        while (isdigit((unsigned char)*p)) p++;
    }
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '+' || *p == '-') p++;
        if (!isdigit((unsigned char)*p)) fallback();
        while (isdigit((unsigned char)*p)) p++;
    }
}

static void skip_value(int depth) {
    if (depth > 32) fallback();
    ws();
    if (*p == '"') { skip_string(); return; }
    if (*p == '{' || *p == '[') {
        char close = *p == '{' ? '}' : ']';
        int object = *p == '{';
        p++;
        ws();
        if (*p == close) { p++; return; }
        for (;;) {
            ws();
            if (object) {
                skip_string();
                ws();
                if (*p++ != ':') fallback();
            }
            skip_value(depth + 1);
            ws();
            if (*p == ',') { p++; continue; }
            if (*p == close) { p++; return; }
            fallback();
        }
    }
    static const char *const words[] = {"true", "false", "null", "NaN", "Infinity", "-Infinity"};
    for (size_t i = 0; i < sizeof words / sizeof *words; i++)
        if (!strncmp(p, words[i], strlen(words[i]))) { p += strlen(words[i]); return; }
    skip_number();
}

/* A JSON integer of at most 9 digits, no fraction or exponent (else fallback). */
static long small_int(void) {
    int negative = *p == '-';
    if (negative) p++;
    if (!isdigit((unsigned char)*p) || (*p == '0' && isdigit((unsigned char)p[1]))) fallback();
    long value = 0;
    int digits = 0;
    while (isdigit((unsigned char)*p)) { value = value * 10 + (*p - '0'); p++; digits++; }
    if (digits > 9 || *p == '.' || *p == 'e' || *p == 'E') fallback();
    return negative ? -value : value;
}

/* null, [] or an array of plain strings; *is_default when null or empty (the stand-in's defaults). */
static int string_list(char **out, int *is_default) {
    int n = 0;
    *is_default = 0;
    if (!strncmp(p, "null", 4)) { p += 4; *is_default = 1; return 0; }
    if (*p != '[') fallback();
    p++;
    ws();
    if (*p == ']') { p++; *is_default = 1; return 0; }
    for (;;) {
        ws();
        if (n >= MAX_GPUS) fallback();
        out[n++] = string_plain();
        ws();
        if (*p == ',') { p++; continue; }
        if (*p == ']') { p++; return n; }
        fallback();
    }
}

static char *read_file(const char *path, size_t limit) {
    FILE *f = fopen(path, "rb");
    if (!f) fallback();
    char *buf = malloc(limit + 1);
    if (!buf) fallback();
    size_t n = fread(buf, 1, limit + 1, f);
    int bad = ferror(f);
    fclose(f);
    if (bad || n > limit) fallback();
    buf[n] = 0;
    if (strlen(buf) != n) fallback(); /* a NUL byte */
    return buf;
}

static void load_config(const char *path, struct config *c) {
    char *text = read_file(path, 1 << 20);
    for (const char *q = text; *q; q++)
        if ((unsigned char)*q >= 0x80) fallback();
    memset(c, 0, sizeof *c);
    c->uuids_default = c->bus_ids_default = 1;
    p = text;
    ws();
    if (*p != '{') fallback();
    p++;
    ws();
    if (*p != '}') {
        for (;;) {
            ws();
            const char *key_at = p;
            skip_string();
            size_t key_len = (size_t)(p - key_at) - 2;
            char key[64];
            if (key_len >= sizeof key) key_len = sizeof key - 1;
            memcpy(key, key_at + 1, key_len);
            key[key_len] = 0;
            if (memchr(key_at + 1, '\\', key_len)) fallback(); /* an escaped key may spell one we read */
            ws();
            if (*p++ != ':') fallback();
            ws();
            if (!strcmp(key, "gpu_count")) { c->gpu_count = small_int(); c->has_count = 1; }
            else if (!strcmp(key, "gpu_total_mib")) { c->gpu_total_mib = small_int(); c->has_total = 1; }
            else if (!strcmp(key, "gpu_dir")) c->gpu_dir = string_plain();
            else if (!strcmp(key, "gpu_name")) c->gpu_name = string_plain();
            else if (!strcmp(key, "alloc_dir")) c->alloc_dir = string_plain();
            else if (!strcmp(key, "driver_failed_flag")) c->driver_failed_flag = string_plain();
            else if (!strcmp(key, "phantom_file")) {
                if (!strncmp(p, "null", 4) || !strncmp(p, "\"\"", 2)) { skip_value(0); c->phantom_null = 1; c->phantom_file = NULL; }
                else { c->phantom_file = string_plain(); c->phantom_null = 0; }
            }
            else if (!strcmp(key, "uuids")) c->n_uuids = string_list(c->uuids, &c->uuids_default);
            else if (!strcmp(key, "pci_bus_ids")) c->n_bus_ids = string_list(c->bus_ids, &c->bus_ids_default);
            else skip_value(0);
            ws();
            if (*p == ',') { p++; continue; }
            if (*p == '}') break;
            fallback();
        }
    }
    p++;
    ws();
    if (*p) fallback();
    free(text);
    if (!c->has_count || !c->gpu_dir || c->gpu_count < 0 || c->gpu_count > MAX_GPUS) fallback();
    if (!c->has_total) c->gpu_total_mib = 143771;
    if (!c->gpu_name) c->gpu_name = "NVIDIA H200";
    if (c->gpu_total_mib < 0 || !plain_ascii(c->gpu_name) || !plain_ascii(c->gpu_dir)) fallback();
    if (!c->uuids_default && c->n_uuids < c->gpu_count) fallback();
    if (!c->bus_ids_default && c->n_bus_ids < c->gpu_count) fallback();
    for (int i = 0; i < c->n_uuids; i++) if (!plain_ascii(c->uuids[i])) fallback();
    for (int i = 0; i < c->n_bus_ids; i++) if (!plain_ascii(c->bus_ids[i])) fallback();
}

/* ---- the state: who holds which GPU file, and how much each holds ---- */

struct app { int gpu; long pid; char name[256]; long mib; };
static struct app apps[MAX_APPS];
static int n_apps;
static long used[MAX_GPUS], util[MAX_GPUS];

static double boot_time(void) {
    char *stat = read_file("/proc/stat", 1 << 20);
    char *line = strstr(stat, "\nbtime ");
    double boot = line ? strtod(line + 7, NULL) : 0.0;
    free(stat);
    return boot;
}

/* 1: started at *start; 0: vanished (skipped, as the stand-in does) */
static int process_start(long pid, double boot, double hz, double *start) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)buf[i] >= 0x80 || !buf[i]) fallback(); /* read as text by the stand-in */
    char *close = strrchr(buf, ')');
    if (!close) fallback();
    char *q = close + 1;
    for (int field = 0; field < 19; field++) {
        while (*q == ' ') q++;
        while (*q && *q != ' ') q++;
    }
    while (*q == ' ') q++;
    if (!isdigit((unsigned char)*q)) fallback();
    *start = boot + (double)strtoll(q, NULL, 10) / hz;
    return 1;
}

/* The stand-in's _read_number: 0 for None (missing, stale, a directory), else 1 and *value. */
static int read_number(const char *path, double not_before, long *value) {
    struct stat st;
    if (stat(path, &st) != 0) return 0;
    double mtime = (double)st.st_mtim.tv_sec + (double)st.st_mtim.tv_nsec * 1e-9;
    if (mtime + 1.0 < not_before) return 0;
    if (S_ISDIR(st.st_mode)) return 0; /* open() raises IsADirectoryError: None */
    if (!S_ISREG(st.st_mode)) fallback();
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    char buf[64];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    int more = fgetc(f) != EOF, bad = ferror(f);
    fclose(f);
    if (more || bad) fallback();
    buf[n] = 0;
    char *s = buf, *e = buf + n;
    for (char *q = buf; q < e; q++)
        if ((unsigned char)*q >= 0x80 || !*q) fallback();
    while (s < e && strchr(" \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f", *s)) s++;
    while (e > s && strchr(" \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f", e[-1])) e--;
    *value = 0;
    if (s == e) return 1; /* int("" or "0") */
    char *q = s;
    int negative = 0;
    if (*q == '+' || *q == '-') { negative = *q == '-'; q++; }
    if (q == e || e - q > 12) fallback();
    long v = 0;
    for (; q < e; q++) {
        if (!isdigit((unsigned char)*q)) fallback(); /* int() also reads 1_000 and other digits: not here */
        v = v * 10 + (*q - '0');
    }
    *value = negative ? -v : v;
    return 1;
}

static void process_name(long pid, char *out, size_t size) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%ld/cmdline", pid);
    FILE *f = fopen(path, "rb");
    size_t n = 0;
    if (f) {
        n = fread(out, 1, size - 1, f);
        fclose(f);
    }
    out[n] = 0;
    if (!out[0] || strlen(out) >= size - 1 || !plain_ascii(out)) fallback(); /* comm, long or odd names */
}

static int compare_apps(const void *a, const void *b) {
    const struct app *x = a, *y = b;
    if (x->gpu != y->gpu) return x->gpu < y->gpu ? -1 : 1;
    if (x->pid != y->pid) return x->pid < y->pid ? -1 : 1;
    int names = strcmp(x->name, y->name);
    if (names) return names;
    return (x->mib > y->mib) - (x->mib < y->mib);
}

struct holder { long pid; unsigned long long gpus; /* a bit per GPU file it holds open */ };

static int compare_holders(const void *a, const void *b) {
    long x = ((const struct holder *)a)->pid, y = ((const struct holder *)b)->pid;
    return (x > y) - (x < y);
}

static void scan(const struct config *c) {
    static char wanted[2 * MAX_GPUS][PATH_MAX];
    static int wanted_gpu[2 * MAX_GPUS];
    int n_wanted = 0;
    size_t dir_len = strlen(c->gpu_dir);
    if (c->gpu_dir[0] != '/') fallback();
    for (int i = 0; i < c->gpu_count; i++) {
        snprintf(wanted[n_wanted], PATH_MAX, "%s%snvidia%d", c->gpu_dir,
                 dir_len && c->gpu_dir[dir_len - 1] == '/' ? "" : "/", i);
        wanted_gpu[n_wanted++] = i;
        char real[PATH_MAX];
        if (realpath(wanted[n_wanted - 1], real)) {
            strcpy(wanted[n_wanted], real);
            wanted_gpu[n_wanted++] = i;
        } else {
            fallback(); /* a missing device file: the stand-in's realpath still normalises its path */
        }
    }
    static struct holder holders[1 << 16];
    int n_holders = 0;
    pid_t me = getpid();
    DIR *proc = opendir("/proc");
    if (!proc) fallback();
    struct dirent *entry;
    while ((entry = readdir(proc))) {
        const char *name = entry->d_name;
        if (!isdigit((unsigned char)name[0])) continue;
        int digits = 1;
        for (const char *q = name; *q; q++) if (!isdigit((unsigned char)*q)) digits = 0;
        if (!digits) continue;
        long pid = atol(name);
        if (pid == me) continue;
        char fd_dir[300];
        snprintf(fd_dir, sizeof fd_dir, "/proc/%s/fd", name);
        DIR *fds = opendir(fd_dir);
        if (!fds) continue;
        unsigned long long bits = 0;
        struct dirent *fd;
        while ((fd = readdir(fds))) {
            if (fd->d_name[0] == '.') continue;
            char link[600], target[PATH_MAX];
            snprintf(link, sizeof link, "%s/%s", fd_dir, fd->d_name);
            ssize_t len = readlink(link, target, sizeof target - 1);
            if (len < 0) continue;
            target[len] = 0;
            /* the stand-in's dict {path: gpu, realpath: gpu}: the last GPU to name a path has it */
            for (int w = n_wanted - 1; w >= 0; w--)
                if (!strcmp(target, wanted[w])) { bits |= 1ULL << wanted_gpu[w]; break; }
        }
        closedir(fds);
        if (bits) {
            if (n_holders >= (int)(sizeof holders / sizeof *holders)) fallback();
            holders[n_holders].pid = pid;
            holders[n_holders++].gpus = bits;
        }
    }
    closedir(proc);
    /* by pid, as the stand-in walks them */
    qsort(holders, (size_t)n_holders, sizeof *holders, compare_holders);
    double boot = boot_time(), hz = (double)sysconf(_SC_CLK_TCK);
    for (int k = 0; k < n_holders; k++) {
        long pid = holders[k].pid;
        unsigned long long bits = holders[k].gpus;
        double start;
        if (!process_start(pid, boot, hz, &start)) continue;
        char name[256];
        process_name(pid, name, sizeof name);
        for (int gpu = 0; gpu < c->gpu_count; gpu++) {
            if (!(bits & (1ULL << gpu))) continue;
            char path[PATH_MAX];
            snprintf(path, sizeof path, "%s/%ld.%d", c->alloc_dir, pid, gpu);
            long mib, u;
            if (!read_number(path, start, &mib)) mib = DEFAULT_CONTEXT_MIB;
            else if (mib < 0) mib = 0;
            snprintf(path, sizeof path, "%s/%ld.%d.util", c->alloc_dir, pid, gpu);
            if (!read_number(path, start, &u)) u = 0;
            used[gpu] += mib;
            u = u < 0 ? 0 : (u > 100 ? 100 : u);
            if (u > util[gpu]) util[gpu] = u;
            if (n_apps >= MAX_APPS) fallback();
            apps[n_apps].gpu = gpu;
            apps[n_apps].pid = pid;
            strcpy(apps[n_apps].name, name);
            apps[n_apps].mib = mib;
            n_apps++;
        }
    }
    for (int gpu = 0; gpu < c->gpu_count; gpu++)
        if (used[gpu] > c->gpu_total_mib) used[gpu] = c->gpu_total_mib;
    qsort(apps, (size_t)n_apps, sizeof *apps, compare_apps);
}

/* ---- the command line and the CSV ---- */

static const char *const GPU_FIELDS[][3] = {  /* canonical, alias, unit */
    {"index", NULL, NULL}, {"uuid", "gpu_uuid", NULL}, {"name", "gpu_name", NULL},
    {"memory.used", NULL, "MiB"}, {"memory.total", NULL, "MiB"}, {"memory.free", NULL, "MiB"},
    {"utilization.gpu", NULL, "%"}, {"pci.bus_id", "gpu_bus_id", NULL},
};
static const char *const APP_FIELDS[][3] = {
    {"pid", NULL, NULL}, {"process_name", "name", NULL}, {"used_memory", "used_gpu_memory", "MiB"},
    {"gpu_uuid", NULL, NULL}, {"gpu_bus_id", NULL, NULL}, {"gpu_name", NULL, NULL},
};

/* FIELDS (comma-separated) as indices into table; any unknown or odd one: fallback (the stand-in refuses it). */
static int fields_of(const char *arg, const char *const table[][3], int table_len, int *out) {
    int n = 0;
    char copy[1024];
    if (strlen(arg) >= sizeof copy || !plain_ascii(arg)) fallback();
    strcpy(copy, arg);
    char *save = NULL;
    for (char *part = copy;; part = NULL) {
        char *tok = strtok_r(part, ",", &save);
        if (!tok) break;
        while (*tok == ' ') tok++;
        char *end = tok + strlen(tok);
        while (end > tok && end[-1] == ' ') *--end = 0;
        int found = -1;
        for (int i = 0; i < table_len; i++)
            if (!strcmp(tok, table[i][0]) || (table[i][1] && !strcmp(tok, table[i][1]))) { found = i; break; }
        if (found < 0 || n >= MAX_FIELDS) fallback();
        out[n++] = found;
    }
    /* strtok_r skips empty fields ("a,,b", a trailing comma) that the stand-in refuses */
    int commas = 0;
    for (const char *q = arg; *q; q++) commas += *q == ',';
    if (n == 0 || commas != n - 1) fallback();
    return n;
}

static void format_of(const char *spec, int *header, int *units) {
    char copy[256];
    if (strlen(spec) >= sizeof copy || !plain_ascii(spec)) fallback();
    strcpy(copy, spec);
    *header = *units = 1;
    int index = 0, commas = 0;
    for (const char *q = spec; *q; q++) commas += *q == ',';
    char *save = NULL;
    for (char *part = copy;; part = NULL, index++) {
        char *tok = strtok_r(part, ",", &save);
        if (!tok) break;
        while (*tok == ' ') tok++;
        char *end = tok + strlen(tok);
        while (end > tok && end[-1] == ' ') *--end = 0;
        if (index == 0 ? strcmp(tok, "csv") != 0 : (strcmp(tok, "noheader") && strcmp(tok, "nounits"))) fallback();
        if (!strcmp(tok, "noheader")) *header = 0;
        if (!strcmp(tok, "nounits")) *units = 0;
    }
    if (index != commas + 1) fallback();
}

static char out[1 << 20];
static size_t out_len;

static void put(const char *s) {
    size_t n = strlen(s);
    if (out_len + n >= sizeof out) fallback();
    memcpy(out + out_len, s, n);
    out_len += n;
}

static void put_long(long v, const char *unit, int units) {
    char buf[64];
    snprintf(buf, sizeof buf, units && unit ? "%ld %s" : "%ld", v, unit ? unit : "");
    put(buf);
}

static const char *uuid_of(const struct config *c, int i, char *buf) {
    if (!c->uuids_default) return c->uuids[i];
    sprintf(buf, "GPU-%08x-0000-0000-0000-000000000000", i);
    return buf;
}

static const char *bus_of(const struct config *c, int i, char *buf) {
    if (!c->bus_ids_default) return c->bus_ids[i];
    sprintf(buf, "00000000:%02X:00.0", 0x18 + i);
    return buf;
}

int main(int argc, char **argv) {
    original_argv = argv;
    const char *query_gpu = NULL, *query_apps = NULL, *format = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strncmp(argv[i], "--query-gpu=", 12) && !query_gpu) query_gpu = argv[i] + 12;
        else if (!strncmp(argv[i], "--query-compute-apps=", 21) && !query_apps) query_apps = argv[i] + 21;
        else if (!strncmp(argv[i], "--format=", 9) && !format) format = argv[i] + 9;
        else fallback();
    }
    if (!!query_gpu + !!query_apps != 1 || !format) fallback();

    const char *home = getenv("HOME");
    if (!home || home[0] != '/') fallback();
    char path[PATH_MAX];
    const char *config_path = getenv("NVIDIA_SMI_SIM_CONFIG");
    if (!config_path || !*config_path) config_path = getenv("SGLANG_SIM_CONFIG");
    if (!config_path || !*config_path) {
        snprintf(path, sizeof path, "%s/.sim/config.json", home);
        config_path = path;
    }
    /* the stand-in's sim_dir is dirname(abspath(path)): only a plain absolute path is taken here */
    if (config_path[0] != '/' || strstr(config_path, "//") || strstr(config_path, "/./") ||
        strstr(config_path, "/../") || !plain_ascii(config_path))
        fallback();
    char sim_dir[PATH_MAX];
    snprintf(sim_dir, sizeof sim_dir, "%s", config_path);
    *strrchr(sim_dir, '/') = 0;
    if (!sim_dir[0]) fallback();

    struct config c;
    load_config(config_path, &c);
    char knob[PATH_MAX];
    snprintf(knob, sizeof knob, "%s/.sim/query_delay_s", home);
    if (access(knob, F_OK) == 0) fallback();
    static char defaults[3][PATH_MAX + 32];
    if (!c.alloc_dir) { snprintf(defaults[0], sizeof defaults[0], "%s/alloc", sim_dir); c.alloc_dir = defaults[0]; }
    if (!c.driver_failed_flag) {
        snprintf(defaults[1], sizeof defaults[1], "%s/driver_failed", sim_dir);
        c.driver_failed_flag = defaults[1];
    }
    if (!c.phantom_file && !c.phantom_null) {
        snprintf(defaults[2], sizeof defaults[2], "%s/phantom.json", sim_dir);
        c.phantom_file = defaults[2];
    }
    if (!c.driver_failed_flag[0] || access(c.driver_failed_flag, F_OK) == 0 || errno != ENOENT) fallback();
    if (c.phantom_file && (access(c.phantom_file, F_OK) == 0 || errno != ENOENT)) fallback();
    if (!plain_ascii(c.alloc_dir) || c.alloc_dir[0] != '/') fallback();

    scan(&c);
    int header, units, fields[MAX_FIELDS];
    format_of(format, &header, &units);
    char a[64], b[64];
    if (query_gpu) {
        int n = fields_of(query_gpu, GPU_FIELDS, 8, fields);
        if (header) {
            for (int k = 0; k < n; k++) {
                if (k) put(", ");
                put(GPU_FIELDS[fields[k]][0]);
                if (GPU_FIELDS[fields[k]][2]) { put(" ["); put(GPU_FIELDS[fields[k]][2]); put("]"); }
            }
            put("\n");
        }
        for (int i = 0; i < c.gpu_count; i++) {
            for (int k = 0; k < n; k++) {
                if (k) put(", ");
                const char *field = GPU_FIELDS[fields[k]][0];
                if (!strcmp(field, "index")) put_long(i, NULL, 0);
                else if (!strcmp(field, "uuid")) put(uuid_of(&c, i, a));
                else if (!strcmp(field, "name")) put(c.gpu_name);
                else if (!strcmp(field, "pci.bus_id")) put(bus_of(&c, i, b));
                else if (!strcmp(field, "utilization.gpu")) put_long(util[i], "%", units);
                else if (!strcmp(field, "memory.used")) put_long(used[i], "MiB", units);
                else if (!strcmp(field, "memory.total")) put_long(c.gpu_total_mib, "MiB", units);
                else put_long(c.gpu_total_mib - used[i], "MiB", units);
            }
            put("\n");
        }
    } else {
        int n = fields_of(query_apps, APP_FIELDS, 6, fields);
        if (header) {
            for (int k = 0; k < n; k++) {
                if (k) put(", ");
                put(!strcmp(APP_FIELDS[fields[k]][0], "used_memory") ? "used_gpu_memory" : APP_FIELDS[fields[k]][0]);
                if (APP_FIELDS[fields[k]][2]) { put(" ["); put(APP_FIELDS[fields[k]][2]); put("]"); }
            }
            put("\n");
        }
        for (int j = 0; j < n_apps; j++) {
            for (int k = 0; k < n; k++) {
                if (k) put(", ");
                const char *field = APP_FIELDS[fields[k]][0];
                if (!strcmp(field, "pid")) put_long(apps[j].pid, NULL, 0);
                else if (!strcmp(field, "process_name")) put(apps[j].name);
                else if (!strcmp(field, "used_memory")) put_long(apps[j].mib, "MiB", units);
                else if (!strcmp(field, "gpu_uuid")) put(uuid_of(&c, apps[j].gpu, a));
                else if (!strcmp(field, "gpu_bus_id")) put(bus_of(&c, apps[j].gpu, b));
                else put(c.gpu_name);
            }
            put("\n");
        }
    }
    if (fwrite(out, 1, out_len, stdout) != out_len || fflush(stdout) != 0) return 1;
    return 0;
}
