/* SIMULATION (TEST DOUBLE): each sandbox host's own network stack, for every process of its user.
 *
 * The sandbox hosts share this machine's one network stack; a real GPU host has its own. Two real
 * hosts both bind 0.0.0.0:30000 and each answers on its own 127.0.0.1; here they would collide, and
 * host B's 127.0.0.1 would be host A's. Preloaded (LD_PRELOAD, set by the host's sshd SetEnv and
 * dotfiles) into that host's processes: the stand-in SGLang, deployctl's host-side helpers (which
 * run `python3 -I -S`, so no Python-level hook would reach them), the routers' Rust cores. For them:
 *
 *   bind()    to 0.0.0.0 / :: / 127.0.0.1 / ::1 binds $SANDBOX_OWN_ADDRESS (a real host's wildcard
 *             bind answers from the network on its address);
 *   connect() to 127.0.0.1 / ::1 goes to $SANDBOX_OWN_ADDRESS (the host's own loopback);
 *   open() of /proc/net/tcp and /proc/net/tcp6 lists only this host's sockets: those on its own
 *   address, plus wildcard ones (0.0.0.0, ::) of processes outside the sandbox, which a real
 *   host would share too. The other hosts' listeners on 127.0.0.x are not this host's.
 *   recv()/recvfrom() on a NETLINK_SOCK_DIAG socket (the kernel's socket diagnostics, as `ss` and
 *   deploy/remote/listeners.py read them) drop the other hosts' sockets by the same rule.
 *
 * A worker URL naming 127.0.0.1 in a router on host A therefore reaches A's replica only, as on a
 * real network. Without SANDBOX_OWN_ADDRESS (an IPv4 127.x address) nothing changes.
 * Built by sandbox/hosts.py with the system C compiler (tests/bootstrap.sh installs gcc).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

static struct in_addr own;
static int have = -1;

static int ready(void) {
    if (have < 0) {
        const char *text = getenv("SANDBOX_OWN_ADDRESS");
        have = text != NULL && strncmp(text, "127.", 4) == 0 && inet_pton(AF_INET, text, &own) == 1;
    }
    return have;
}

static int v4_mapped_loopback(const struct in6_addr *a) {
    static const unsigned char prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return memcmp(a->s6_addr, prefix, 12) == 0 && a->s6_addr[12] == 127 && a->s6_addr[13] == 0 &&
           a->s6_addr[14] == 0 && a->s6_addr[15] == 1;
}

/* the rewritten address in *out and its length, or 0 to use the caller's */
static socklen_t rewrite(const struct sockaddr *addr, socklen_t len, struct sockaddr_storage *out, int binding) {
    if (addr == NULL || !ready())
        return 0;
    if (addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        struct sockaddr_in in;
        memcpy(&in, addr, sizeof in);
        uint32_t a = ntohl(in.sin_addr.s_addr);
        if (a == INADDR_LOOPBACK || (binding && a == INADDR_ANY)) {
            in.sin_addr = own;
            memcpy(out, &in, sizeof in);
            return sizeof in;
        }
    } else if (addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 in6;
        memcpy(&in6, addr, sizeof in6);
        if (IN6_IS_ADDR_LOOPBACK(&in6.sin6_addr) || v4_mapped_loopback(&in6.sin6_addr) ||
            (binding && IN6_IS_ADDR_UNSPECIFIED(&in6.sin6_addr))) {
            memset(&in6.sin6_addr, 0, sizeof in6.sin6_addr);
            in6.sin6_addr.s6_addr[10] = 0xff; /* ::ffff:own, on a dual-stack socket */
            in6.sin6_addr.s6_addr[11] = 0xff;
            memcpy(&in6.sin6_addr.s6_addr[12], &own, 4);
            memcpy(out, &in6, sizeof in6);
            return sizeof in6;
        }
    }
    return 0;
}

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static int (*real)(int, const struct sockaddr *, socklen_t);
    struct sockaddr_storage mapped;
    socklen_t n;
    if (real == NULL)
        real = (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "bind");
    n = rewrite(addr, len, &mapped, 1);
    return n ? real(fd, (struct sockaddr *)&mapped, n) : real(fd, addr, len);
}

int connect(int fd, const struct sockaddr *addr, socklen_t len) {
    static int (*real)(int, const struct sockaddr *, socklen_t);
    struct sockaddr_storage mapped;
    socklen_t n;
    if (real == NULL)
        real = (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "connect");
    n = rewrite(addr, len, &mapped, 0);
    return n ? real(fd, (struct sockaddr *)&mapped, n) : real(fd, addr, len);
}

/* -- /proc/net/tcp{,6}: only this host's rows ------------------------------------------------- */

static int keep_row(const char *line, int v6) {
    /* "  sl  local_address rem_address st ...": local_address is HEX:PORT, IPv4 as one
     * little-endian word, IPv6 as four host-order words */
    char want[40], wild[40], mapped[40];
    const char *colon = strchr(line, ':');
    unsigned char *b = (unsigned char *)&own;
    if (colon == NULL)
        return 1;
    colon++;
    while (*colon == ' ')
        colon++;
    if (!v6) {
        snprintf(want, sizeof want, "%02X%02X%02X%02X:", b[3], b[2], b[1], b[0]);
        return strncmp(colon, want, 9) == 0 || strncmp(colon, "00000000:", 9) == 0;
    }
    snprintf(wild, sizeof wild, "%s", "00000000000000000000000000000000:");
    snprintf(mapped, sizeof mapped, "0000000000000000FFFF0000%02X%02X%02X%02X:", b[3], b[2], b[1], b[0]);
    return strncmp(colon, wild, 33) == 0 || strncmp(colon, mapped, 33) == 0;
}

static int filtered(const char *path) {
    static int (*real_open)(const char *, int, ...);
    int v6, in, out;
    FILE *src;
    char line[512];
    if (real_open == NULL)
        real_open = (int (*)(const char *, int, ...))dlsym(RTLD_NEXT, "open");
    v6 = path[strlen(path) - 1] == '6';
    in = real_open(path, O_RDONLY);
    if (in < 0)
        return -1;
    src = fdopen(in, "r");
    out = memfd_create("sim-proc-net-tcp", 0);
    if (src == NULL || out < 0) {
        if (src != NULL)
            fclose(src);
        else
            close(in);
        return -1;
    }
    for (int first = 1; fgets(line, sizeof line, src) != NULL; first = 0)
        if (first || keep_row(line, v6))
            if (write(out, line, strlen(line)) < 0)
                break;
    fclose(src);
    lseek(out, 0, SEEK_SET);
    return out;
}

static int is_proc_net_tcp(const char *path) {
    return path != NULL && ready() &&
           (strcmp(path, "/proc/net/tcp") == 0 || strcmp(path, "/proc/net/tcp6") == 0 ||
            strcmp(path, "/proc/self/net/tcp") == 0 || strcmp(path, "/proc/self/net/tcp6") == 0);
}

#define OPEN_WRAPPER(name, ...)                                                                    \
    int name(__VA_ARGS__) {                                                                        \
        static int (*real)();                                                                      \
        mode_t mode = 0;                                                                           \
        if (flags & (O_CREAT | O_TMPFILE)) {                                                      \
            va_list ap;                                                                            \
            va_start(ap, flags);                                                                   \
            mode = va_arg(ap, mode_t);                                                             \
            va_end(ap);                                                                            \
        }                                                                                          \
        if (is_proc_net_tcp(path))                                                                 \
            return filtered(path);                                                                 \
        if (real == NULL)                                                                          \
            real = (int (*)())dlsym(RTLD_NEXT, #name);                                             \
        return OPEN_CALL;                                                                          \
    }

#define OPEN_CALL real(path, flags, mode)
OPEN_WRAPPER(open, const char *path, int flags, ...)
OPEN_WRAPPER(open64, const char *path, int flags, ...)
#undef OPEN_CALL
#define OPEN_CALL real(dirfd, path, flags, mode)
OPEN_WRAPPER(openat, int dirfd, const char *path, int flags, ...)
OPEN_WRAPPER(openat64, int dirfd, const char *path, int flags, ...)

/* -- NETLINK_SOCK_DIAG answers: only this host's sockets, as /proc/net/tcp{,6} above ------------- */

static int is_sock_diag(int fd) {
    int value = 0;
    socklen_t n = sizeof value;
    if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &value, &n) != 0 || value != AF_NETLINK)
        return 0;
    n = sizeof value;
    return getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &value, &n) == 0 && value == NETLINK_SOCK_DIAG;
}

static int keep_socket(const struct inet_diag_msg *m) {
    static const unsigned char zero[16];
    static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    const unsigned char *src = (const unsigned char *)m->id.idiag_src;
    if (m->idiag_family == AF_INET)
        return memcmp(src, &own, 4) == 0 || memcmp(src, zero, 4) == 0;
    if (m->idiag_family == AF_INET6)
        return memcmp(src, zero, 16) == 0 || (memcmp(src, mapped, 12) == 0 && memcmp(src + 12, &own, 4) == 0);
    return 1;
}

/* buf[0..len) without the messages about other hosts' sockets; anything it cannot read stays */
static ssize_t drop_other_hosts(char *buf, ssize_t len) {
    ssize_t in = 0, out = 0;
    while (len - in >= (ssize_t)sizeof(struct nlmsghdr)) {
        struct nlmsghdr h;
        ssize_t size;
        memcpy(&h, buf + in, sizeof h);
        if (h.nlmsg_len < sizeof h || (ssize_t)h.nlmsg_len > len - in)
            break;
        size = NLMSG_ALIGN(h.nlmsg_len) < (size_t)(len - in) ? (ssize_t)NLMSG_ALIGN(h.nlmsg_len) : len - in;
        if (h.nlmsg_type != SOCK_DIAG_BY_FAMILY || h.nlmsg_len < NLMSG_LENGTH(sizeof(struct inet_diag_msg)) ||
            keep_socket((const struct inet_diag_msg *)(buf + in + NLMSG_HDRLEN))) {
            memmove(buf + out, buf + in, size);
            out += size;
        }
        in += size;
    }
    memmove(buf + out, buf + in, len - in);
    return out + (len - in);
}

/* A chunk that held only other hosts' sockets is not returned empty (an empty read ends a netlink
 * reader): the next chunk is read instead; the dump always ends with NLMSG_DONE, which is kept. */
#define RECV_WRAPPER(name, CALL, ...)                                                               \
    ssize_t name(__VA_ARGS__) {                                                                     \
        static ssize_t (*real)();                                                                   \
        if (real == NULL)                                                                           \
            real = (ssize_t (*)())dlsym(RTLD_NEXT, #name);                                          \
        for (;;) {                                                                                  \
            ssize_t n = CALL, kept;                                                                 \
            if (n <= 0 || !ready() || !is_sock_diag(fd))                                            \
                return n;                                                                           \
            kept = drop_other_hosts(buf, n);                                                        \
            if (kept > 0 || (flags & (MSG_PEEK | MSG_DONTWAIT)))                                    \
                return kept;                                                                        \
        }                                                                                           \
    }

RECV_WRAPPER(recv, real(fd, buf, len, flags), int fd, void *buf, size_t len, int flags)
RECV_WRAPPER(recvfrom, real(fd, buf, len, flags, from, fromlen), int fd, void *buf, size_t len, int flags,
             struct sockaddr *from, socklen_t *fromlen)
